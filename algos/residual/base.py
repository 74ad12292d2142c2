"""Frozen base policies for the residual wrapper: a classical controller, a trained run, a callable.

A base policy is any object with pure `init() -> carry` and `apply(obs [obs], carry) ->
(action [A] in [-1, 1], carry)` over one (unbatched) env: `sim.quadrotor.controller.Controller`
already has this shape (its carry holds the PID integrators and the rotor-speed estimate).
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

    init: Callable[[], Any]
    apply: Callable[[jax.Array, Any], tuple[jax.Array, Any]]
    obs_size: int | None = None


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
