"""Domain randomization of the Crazyflie dynamics, as a wrapper (STYLE.md §2).

Each parameter is scaled by U(1 − r, 1 + r) per episode, r from `RandomizationConfig` (±10 % by
default): mass, each principal inertia, the thrust curve (all three coefficients together), the yaw
torque constant and the motor time constants (rise and fall together).
"""

from __future__ import annotations

import dataclasses

import jax

from sim.env import Env, State, Wrapper
from sim.quadrotor.params import QuadParams


@dataclasses.dataclass(frozen=True)
class RandomizationConfig:
    """Relative half-widths of the uniform parameter scaling; 0 disables a parameter."""

    mass: float = 0.1
    """Mass ±fraction."""
    inertia: float = 0.1
    """Each principal inertia ±fraction (independently)."""
    thrust: float = 0.1
    """Thrust curve ±fraction (one factor for all motors)."""
    torque: float = 0.1
    """Yaw torque constant ±fraction."""
    motor_tau: float = 0.1
    """Motor time constants ±fraction."""


def randomize_params(key: jax.Array, p: QuadParams, cfg: RandomizationConfig) -> QuadParams:
    """Samples scaled parameters around `p`."""
    k = jax.random.split(key, 5)

    def s(key, r, shape=()):
        return jax.random.uniform(key, shape, minval=1.0 - r, maxval=1.0 + r)

    ji = s(k[1], cfg.inertia, (3,))
    thrust = s(k[2], cfg.thrust)
    tau = s(k[4], cfg.motor_tau)
    return p.replace(
        mass=p.mass * s(k[0], cfg.mass),
        inertia=tuple(j * ji[i] for i, j in enumerate(p.inertia)),
        thrust=tuple(c * thrust for c in p.thrust),
        torque=p.torque * s(k[3], cfg.torque),
        tau_rise=p.tau_rise * tau,
        tau_fall=p.tau_fall * tau,
    )


class DomainRandomization(Wrapper):
    """Draws new dynamics parameters at every reset of a `QuadrotorEnv`."""

    def __init__(self, env: Env, config: RandomizationConfig = RandomizationConfig()):
        super().__init__(env)
        self.config = config

    def reset(self, rng: jax.Array) -> State:
        key_params, key_env = jax.random.split(rng)
        quad = self.env.unwrapped
        params = randomize_params(key_params, quad.nominal_params, self.config)
        return quad.reset_with_params(key_env, params)


__all__ = ["DomainRandomization", "RandomizationConfig", "randomize_params"]
