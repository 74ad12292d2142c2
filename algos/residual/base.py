"""Frozen base policies for the residual wrapper: a classical controller, a trained run, a callable.

A base policy is any object with pure `init() -> carry` and `apply(obs [obs], carry) ->
(action [A] in [-1, 1], carry)` over one (unbatched) env: `sim.quadrotor.controller.Controller`
already has this shape (its carry holds the PID integrators and the rotor-speed estimate). A base
with `needs_state` also receives the wrapped env's `State` (e.g. one that renders cameras from the
simulator state): `init(state) -> carry`, `apply(obs, carry, state) -> (action, carry)`.

Bases that live above `algos/` (a VLA in `vla/`) register a factory by name (`register_base`), so
that a run folder naming them rebuilds its env once the registering package is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class BasePolicy(NamedTuple):
    """init() -> carry pytree (reset at every episode start);
    apply(obs [obs_size], carry) -> (action [A], carry), pure JAX, unbatched.
    obs_size: the observation size it expects (checked by the wrapper), None if any."""

    init: Callable[..., Any]
    apply: Callable[..., tuple[jax.Array, Any]]
    obs_size: int | None = None
    needs_state: bool = False
    """When True: init(state) and apply(obs, carry, state), `state` the wrapped env's unbatched
    `sim.State` (at reset, and after each step)."""
    observe: Callable[[jax.Array, Any], jax.Array] | None = None
    """The residual's view, observe(obs [obs_size], carry) -> [view_size] (the carry after
    `apply`), in place of the env observation; None: the env observation."""
    view_size: int | None = None
    """Length of `observe`'s view."""


BaseFactory = Callable[[str, Any], BasePolicy]
"""factory(source, env) -> BasePolicy: `source` is `ResidualConfig.base_run` (e.g. a checkpoint
path), `env` the unbatched env the base drives. Raises `ValueError` for an env it cannot drive."""
_REGISTRY: dict[str, BaseFactory] = {}


def register_base(name: str, factory: BaseFactory) -> None:
    """Makes `ResidualConfig.base == name` build its base with `factory` (replacing an earlier
    registration of that name)."""
    _REGISTRY[name] = factory


def registered_base(name: str) -> BaseFactory:
    """The factory registered under `name`; `ValueError` naming what to import when none is."""
    if name not in _REGISTRY:
        raise ValueError(
            f"no residual base {name!r} is registered (its package registers it on import: "
            f'"vla" is registered by vla.residual)'
        )
    return _REGISTRY[name]


def base_from_callable(fn: Callable[[jax.Array], jax.Array], obs_size: int | None = None):
    """A stateless base from `fn(obs [obs_size]) -> action [A]` (pure JAX; e.g. a VLA later)."""
    return BasePolicy(lambda: (), lambda obs, carry: (fn(obs), carry), obs_size)


def base_from_run(run: Any) -> BasePolicy:
    """The deterministic actor of a trained run (`algos.run_folder.load_run(RUN)`), frozen."""
    from algos.run_folder import make_run_policy  # run_folder builds residual envs: no cycle

    policy = make_run_policy(run.config.algo, run.network, run.params, deterministic=True)
    key = jax.random.key(0)  # unused by the deterministic heads

    def apply(obs: jax.Array, carry: Any) -> tuple[jax.Array, Any]:
        return jax.lax.stop_gradient(policy(obs, key)[0]), carry

    return BasePolicy(lambda: (), apply, run.env.observation_size["state"][0])


def zero_policy(action_size: int) -> Callable:
    """A residual policy (`algos.evaluate.rollout` signature) that never corrects: on a
    `ResidualWrapper` it evaluates the base alone.
    policy(obs [B, obs], key) -> (zeros [B, A], {})."""

    def policy(obs: jax.Array, key: jax.Array) -> tuple[jax.Array, dict]:
        return jnp.zeros((*obs.shape[:-1], action_size)), {}

    return policy
