"""Domain randomization of the arm scene, as a wrapper (STYLE.md §2).

Per episode (at reset): cube size, mass and friction, each arm servo's position gain
scaled by U(1 − r, 1 + r), and an extra uniform offset of the cube's start pose. Per step: Gaussian
noise on the actor observation's joint positions and object-centric positions (the critic's
privileged observation stays clean). The noise key is split from `info["rng"]`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sim.env import Env, State, Wrapper
from sim.manipulator.env import ArmParams, obs_fields

_POSITION_FIELDS = ("cube_pos", "cube_minus_tcp", "goal_minus_cube")


@dataclasses.dataclass(frozen=True)
class RandomizationConfig:
    """Relative half-widths of the uniform parameter scaling (0 disables), pose offsets, noise."""

    cube_size: float = 0.1
    """Cube half edge ±fraction."""
    cube_mass: float = 0.3
    """Cube mass ±fraction."""
    cube_friction: float = 0.3
    """Cube sliding friction ±fraction."""
    gains: float = 0.1
    """Each arm servo's kp ±fraction (independently per joint)."""
    cube_position: float = 0.02
    """Extra cube start offset per horizontal axis, ±m."""
    cube_yaw: float = 0.1
    """Extra cube start yaw, ±rad."""
    joint_noise: float = 0.002
    """σ of the noise on observed joint positions, rad."""
    position_noise: float = 0.005
    """σ of the noise on observed cube and relative positions, m."""


def randomize_params(key: jax.Array, p: ArmParams, cfg: RandomizationConfig) -> ArmParams:
    """Samples scaled parameters around `p`."""
    k = jax.random.split(key, 4)

    def s(key, r, shape=()):
        return jax.random.uniform(key, shape, minval=1.0 - r, maxval=1.0 + r)

    return p.replace(
        cube_half_size=p.cube_half_size * s(k[0], cfg.cube_size),
        cube_mass=p.cube_mass * s(k[1], cfg.cube_mass),
        cube_friction=p.cube_friction * s(k[2], cfg.cube_friction),
        gain_scale=p.gain_scale * s(k[3], cfg.gains, p.gain_scale.shape),
    )


class DomainRandomization(Wrapper):
    """Draws new scene parameters at every reset of an `ArmEnv` and adds observation noise."""

    def __init__(self, env: Env, config: RandomizationConfig = RandomizationConfig()):
        super().__init__(env)
        self.config = config
        sigma = []
        for name, size in obs_fields(env.action_size):
            value = config.joint_noise if name == "joint_pos" else 0.0
            value = config.position_noise if name in _POSITION_FIELDS else value
            sigma += [value] * size
        self._sigma = jnp.asarray(sigma, jnp.float32)  # [obs_size]

    def _noisy(self, state: State) -> State:
        rng, key = jax.random.split(state.info["rng"])
        obs = state.obs["state"]
        obs = obs + self._sigma * jax.random.normal(key, obs.shape)
        return state.replace(obs={**state.obs, "state": obs}, info={**state.info, "rng": rng})

    def reset(self, rng: jax.Array) -> State:
        key_params, key_pose, key_env = jax.random.split(rng, 3)
        arm = self.env.unwrapped
        params = randomize_params(key_params, arm.nominal_params, self.config)
        c = self.config
        half = jnp.array([c.cube_position, c.cube_position, c.cube_yaw])
        offset = jax.random.uniform(key_pose, (3,), minval=-half, maxval=half)
        return self._noisy(arm.reset_with_params(key_env, params, offset))

    def step(self, state: State, action: jax.Array) -> State:
        return self._noisy(self.env.step(state, action))


__all__ = ["DomainRandomization", "RandomizationConfig", "randomize_params"]
