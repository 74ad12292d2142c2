"""Perturbations of `arm-pick-place` that a scripted base policy does not survive: imperfect
object perception and a push of the cube, as a wrapper (STYLE.md §2).

Perception (per step, on the actor observation only; the critic's privileged observation stays
clean): the observed cube position is the true one (after any noise of the wrapped env) plus a
per-episode bias, plus Gaussian noise, and with probability `dropout_prob` the previous detection
is delivered again (a missed detection); `cube_minus_tcp` and `goal_minus_cube` are recomputed from
that detection, so the three fields stay consistent, as from one pose estimator.

Push: with probability `push_prob` per episode, at a uniformly drawn control step of
`push_window`, the cube's horizontal velocity is changed by a kick of uniform direction and speed
in `push_speed` (m/s); on the table it slides a few centimetres (≈ v²/(2μg)).

A fraction `episode_prob` of the episodes is perturbed, the others pass through (a mix for
training, or both conditions in one batch). Randomness: the episode draws come from the reset key,
the per-step ones from `info["rng"]`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sim.env import Env, State, Wrapper
from sim.manipulator.env import ArmEnv, obs_fields


@dataclasses.dataclass(frozen=True)
class PerturbationConfig:
    """Object-perception errors and a push of the cube (0 disables each)."""

    episode_prob: float = 1.0
    """Probability that an episode is perturbed at all (the others see the wrapped env as is)."""
    pose_bias: float = 0.01
    """Half-width of the per-episode uniform bias of the observed cube position per horizontal
    axis, m."""
    pose_noise: float = 0.01
    """σ of the per-step Gaussian noise on the observed cube position per axis, m."""
    dropout_prob: float = 0.1
    """Per-step probability that the previous cube detection is delivered again."""
    push_prob: float = 0.5
    """Probability that an episode has a push."""
    push_window: tuple[int, int] = (10, 80)
    """First and last control step at which the push may happen."""
    push_speed: tuple[float, float] = (0.6, 1.0)
    """Range of the horizontal speed change of the cube, m/s."""

    def validate(self) -> None:
        if min(self.pose_bias, self.pose_noise) < 0:
            raise ValueError("perturbation pose_bias and pose_noise must be ≥ 0")
        probs = (self.episode_prob, self.dropout_prob, self.push_prob)
        if not all(0 <= p <= 1 for p in probs):
            raise ValueError("perturbation episode_prob, dropout_prob, push_prob must be in [0, 1]")
        lo, hi = self.push_window
        if not 0 <= lo <= hi:
            raise ValueError(f"push_window must be 0 ≤ first ≤ last, got {self.push_window}")
        if not 0 <= self.push_speed[0] <= self.push_speed[1]:
            raise ValueError(f"push_speed must be 0 ≤ low ≤ high, got {self.push_speed}")


def _slices(action_size: int) -> dict[str, slice]:
    layout, start = {}, 0
    for name, size in obs_fields(action_size):
        layout[name] = slice(start, start + size)
        start += size
    return layout


class Perturbation(Wrapper):
    """Corrupts the cube detection in the actor observation and pushes the cube, on an `ArmEnv`
    (optionally inside `DomainRandomization`).

    info keys: "perturb/active" [] (1: a perturbed episode), "perturb/bias" [3] (m),
    "perturb/cube_seen" [3] (last delivered detection, m), "perturb/push_step" [] int32 (−1: no
    push), "perturb/push_velocity" [2] (m/s).
    """

    def __init__(self, env: Env, config: PerturbationConfig = PerturbationConfig()):
        super().__init__(env)
        config.validate()
        if not isinstance(env.unwrapped, ArmEnv):
            raise ValueError(f"Perturbation needs an ArmEnv, got {type(env.unwrapped).__name__}")
        self.config = config
        self._layout = _slices(env.action_size)
        self._cube_dof = env.unwrapped.index.cube_dof

    def _observe(self, state: State, held: jax.Array, first: bool) -> State:
        """The state with the corrupted detection in `obs["state"]` and a fresh `info["rng"]`."""
        c, ix, info = self.config, self._layout, state.info
        rng, key_noise, key_drop = jax.random.split(info["rng"], 3)
        obs, active = state.obs["state"], info["perturb/active"]
        noise = active * c.pose_noise * jax.random.normal(key_noise, (3,))
        seen = obs[ix["cube_pos"]] + info["perturb/bias"] + noise
        if not first:
            drop = jax.random.bernoulli(key_drop, float(c.dropout_prob)) & (active > 0)
            seen = jnp.where(drop, held, seen)
        obs = (
            obs.at[ix["cube_pos"]]
            .set(seen)
            .at[ix["cube_minus_tcp"]]
            .set(seen - obs[ix["tcp_pos"]])
            .at[ix["goal_minus_cube"]]
            .set(obs[ix["goal_pos"]] - seen)
        )
        info = {**info, "rng": rng, "perturb/cube_seen": seen}
        return state.replace(obs={**state.obs, "state": obs}, info=info)

    def reset(self, rng: jax.Array) -> State:
        c = self.config
        key_env, key_on, key_bias, key_push, key_step, key_dir, key_speed = jax.random.split(rng, 7)
        state = self.env.reset(key_env)
        active = jax.random.bernoulli(key_on, float(c.episode_prob))
        xy = jax.random.uniform(key_bias, (2,), minval=-c.pose_bias, maxval=c.pose_bias)
        push = jax.random.bernoulli(key_push, float(c.push_prob)) & active
        step = jax.random.randint(key_step, (), c.push_window[0], c.push_window[1] + 1)
        angle = jax.random.uniform(key_dir, (), maxval=2 * jnp.pi)
        speed = jax.random.uniform(key_speed, (), minval=c.push_speed[0], maxval=c.push_speed[1])
        info = {
            **state.info,
            "perturb/active": active.astype(jnp.float32),
            "perturb/bias": jnp.concatenate([xy * active, jnp.zeros(1)]),
            "perturb/push_step": jnp.where(push, step, -1).astype(jnp.int32),
            "perturb/push_velocity": speed * jnp.stack([jnp.cos(angle), jnp.sin(angle)]),
        }
        return self._observe(state.replace(info=info), jnp.zeros(3), first=True)

    def step(self, state: State, action: jax.Array) -> State:
        nstate = self.env.step(state, action)
        info = state.info
        px = nstate.data.physics
        kick = jnp.where(nstate.data.step == info["perturb/push_step"], 1.0, 0.0)
        dof = self._cube_dof
        qvel = px.qvel.at[dof : dof + 2].add(kick * info["perturb/push_velocity"])
        nstate = nstate.replace(data=nstate.data.replace(physics=px.replace(qvel=qvel)))
        return self._observe(nstate, info["perturb/cube_seen"], first=False)


__all__ = [
    "Perturbation",
    "PerturbationConfig",
]
