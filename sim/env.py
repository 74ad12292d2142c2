"""The environment contract shared by every simulator (STYLE.md §2).

Field names follow MuJoCo Playground (`State(data, obs, reward, done, metrics, info)`) so that
brax's training wrappers and trainers run on our envs. Envs are written unbatched; batching, episode
limits,
auto-reset, domain randomization and curricula are wrappers (`sim.wrappers`).
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Observation = dict[str, jax.Array]


@struct.dataclass
class State:
    """One environment's state.

    data: simulator state pytree (physics and per-episode parameters).
    obs: {"state": [obs_size] actor observation,
         "privileged_state": [priv_size] critic observation}.
    reward: [] scalar reward of the last transition.
    done: [] 1.0 where the episode terminated (failure), else 0.0.
    metrics: scalars for logging, including every `reward/<term>`.
    info: auxiliary values; `info["rng"]` is the only source of in-step randomness.
    """

    data: Any
    obs: Observation
    reward: jax.Array
    done: jax.Array
    metrics: dict[str, jax.Array] = struct.field(default_factory=dict)
    info: dict[str, Any] = struct.field(default_factory=dict)


class Env(abc.ABC):
    """Stateless bundle of pure functions plus static configuration."""

    @abc.abstractmethod
    def reset(self, rng: jax.Array) -> State:
        """Samples an initial state from key `rng`."""

    @abc.abstractmethod
    def step(self, state: State, action: jax.Array) -> State:
        """Advances one control step; `action` is [action_size] in [-1, 1]."""

    @property
    @abc.abstractmethod
    def observation_size(self) -> dict[str, tuple[int, ...]]:
        """Shape of each observation group."""

    @property
    @abc.abstractmethod
    def action_size(self) -> int:
        """Number of action dimensions."""

    @property
    @abc.abstractmethod
    def dt(self) -> float:
        """Control period in seconds."""

    @property
    def default_action(self) -> jax.Array:
        """[action_size] nominal action (e.g. the hover command); policies may start from it."""
        return jnp.zeros(self.action_size)

    @property
    def unwrapped(self) -> Env:
        return self

    @property
    def compiler_options(self) -> dict[str, Any]:
        """XLA options for every compile of this env's functions:
        `jax.jit(f, compiler_options=env.compiler_options)`."""
        return {}


class Wrapper(Env):
    """Base wrapper: forwards everything to the wrapped env."""

    def __init__(self, env: Env):
        self.env = env

    def reset(self, rng: jax.Array) -> State:
        return self.env.reset(rng)

    def step(self, state: State, action: jax.Array) -> State:
        return self.env.step(state, action)

    @property
    def observation_size(self) -> dict[str, tuple[int, ...]]:
        return self.env.observation_size

    @property
    def action_size(self) -> int:
        return self.env.action_size

    @property
    def dt(self) -> float:
        return self.env.dt

    @property
    def default_action(self) -> jax.Array:
        return self.env.default_action

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped

    @property
    def compiler_options(self) -> dict[str, Any]:
        return self.env.compiler_options

    def __getattr__(self, name: str) -> Any:
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)
