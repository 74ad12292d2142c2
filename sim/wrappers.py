"""Training wrappers: episode limit, auto-reset, batching (after brax `envs/wrappers/training.py`).

Order: `VmapWrapper(AutoResetWrapper(EpisodeWrapper(env)))`; everything inside the vmap is
unbatched. Auto-reset draws a *fresh* initial state (new key from `info["rng"]`) instead of
replaying the first one, and carries `info["progress"]` (the curriculum) across resets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sim.env import Env, State, Wrapper


class EpisodeWrapper(Wrapper):
    """Truncates episodes after `episode_length` steps: `info["truncation"]` = 1, done = 1."""

    def __init__(self, env: Env, episode_length: int):
        super().__init__(env)
        self.episode_length = episode_length

    def reset(self, rng: jax.Array) -> State:
        state = self.env.reset(rng)
        info = {**state.info, "steps": jnp.zeros((), jnp.int32), "truncation": jnp.zeros(())}
        return state.replace(info=info)

    def step(self, state: State, action: jax.Array) -> State:
        nstate = self.env.step(state, action)
        steps = state.info["steps"] + 1
        trunc = ((steps >= self.episode_length) & (nstate.done == 0)).astype(jnp.float32)
        info = {**nstate.info, "steps": steps, "truncation": trunc}
        return nstate.replace(done=jnp.maximum(nstate.done, trunc), info=info)


class AutoResetWrapper(Wrapper):
    """Replaces a finished episode by a freshly sampled one within the same `step` call.

    The returned state keeps `reward`, `done` and `metrics` of the finishing transition, and
    `info["episode_done"]`, `info["episode_metrics"]` hold the finished episode's summary.
    """

    def reset(self, rng: jax.Array) -> State:
        state = self.env.reset(rng)
        return state.replace(info={**state.info, **self._zero_episode(state)})

    @staticmethod
    def _zero_episode(state: State) -> dict:
        z = jnp.zeros(())
        return {
            "episode_return": z,
            "episode_length": z,
            "episode_done": z,
            "last_return": z,
            "last_length": z,
        }

    def step(self, state: State, action: jax.Array) -> State:
        nstate = self.env.step(state, action)
        ret = state.info["episode_return"] + nstate.reward
        length = state.info["episode_length"] + 1.0
        rng, key_reset = jax.random.split(nstate.info["rng"])
        fresh = self.env.reset(key_reset)
        fresh = fresh.replace(
            info={**nstate.info, **fresh.info, "progress": nstate.info["progress"]}
        )
        done = nstate.done > 0

        def pick(a, b):
            return jnp.where(jnp.reshape(done, done.shape + (1,) * (a.ndim - done.ndim)), a, b)

        data = jax.tree.map(pick, fresh.data, nstate.data)
        obs = jax.tree.map(pick, fresh.obs, nstate.obs)
        info = jax.tree.map(pick, fresh.info, nstate.info)
        info.update(
            rng=rng,
            truncation=nstate.info.get("truncation", jnp.zeros(())),
            episode_return=jnp.where(done, 0.0, ret),
            episode_length=jnp.where(done, 0.0, length),
            episode_done=nstate.done,
            last_return=jnp.where(done, ret, state.info["last_return"]),
            last_length=jnp.where(done, length, state.info["last_length"]),
        )
        return nstate.replace(data=data, obs=obs, info=info)


class VmapWrapper(Wrapper):
    """Batches reset and step over a leading axis: `reset([B] keys)`, `step(state, [B, A])`."""

    def reset(self, rng: jax.Array) -> State:
        return jax.vmap(self.env.reset)(rng)

    def step(self, state: State, action: jax.Array) -> State:
        return jax.vmap(self.env.step)(state, action)


def wrap_for_training(env: Env, episode_length: int) -> Env:
    """The standard training stack over an (already randomized) unbatched env."""
    return VmapWrapper(AutoResetWrapper(EpisodeWrapper(env, episode_length)))
