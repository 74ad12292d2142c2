"""Domain randomization of the Crazyflie dynamics, as a wrapper (STYLE.md §2).

Each parameter is scaled by U(1 − r, 1 + r) per episode, r from `RandomizationConfig` (±10 % by
default): mass, each principal inertia, the thrust curve (all three coefficients together), the yaw
torque constant and the motor time constants (rise and fall together). Mass and motor lag can also
be shifted off the nominal model the controller and the actor assume (`HEAVY`: issue 4's heavy
randomization, with `heavy_disturbances` on the env config).
"""

from __future__ import annotations

import dataclasses

import jax

from sim import rng as threefry
from sim.env import Env, State, Wrapper
from sim.quadrotor.env import DisturbanceConfig, QuadrotorConfig
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
    mass_shift: float = 1.0
    """Factor on the nominal mass the draw is centred on (1.3: +30 %)."""
    motor_tau_shift: float = 1.0
    """Factor on the nominal motor time constants the draw is centred on."""

    def validate(self) -> None:
        if not (self.mass_shift > 0 and self.motor_tau_shift > 0):
            raise ValueError("randomization mass_shift and motor_tau_shift must be > 0")


HEAVY = RandomizationConfig(mass_shift=1.3, motor_tau_shift=2.0)
"""Heavy randomization: mass +30 % and motor time constants ×2 around which the default ±10 % are
drawn; disturbances ×3 come from `heavy_disturbances(QuadrotorConfig)`."""


def heavy_disturbances(config: QuadrotorConfig, factor: float = 3.0) -> QuadrotorConfig:
    """`config` with the per-episode disturbance force and torque σ multiplied by `factor`."""
    d = config.disturbance
    return dataclasses.replace(
        config, disturbance=DisturbanceConfig(d.force * factor, d.torque * factor)
    )


def randomize_params(key: jax.Array, p: QuadParams, cfg: RandomizationConfig) -> QuadParams:
    """Samples scaled parameters around `p`."""
    k = threefry.split(key, 5)
    # hashed at once (sim.rng.bits: less compilation)
    bits = threefry.bits([(k[0], ()), (k[1], (3,)), (k[2], ()), (k[3], ()), (k[4], ())])

    def s(i, r):
        return threefry.uniform_from_bits(bits[i], 1.0 - r, 1.0 + r)

    ji = s(1, cfg.inertia)
    thrust = s(2, cfg.thrust)
    tau = s(4, cfg.motor_tau)
    tau = tau * cfg.motor_tau_shift
    return p.replace(
        mass=p.mass * cfg.mass_shift * s(0, cfg.mass),
        inertia=tuple(j * ji[i] for i, j in enumerate(p.inertia)),
        thrust=tuple(c * thrust for c in p.thrust),
        torque=p.torque * s(3, cfg.torque),
        tau_rise=p.tau_rise * tau,
        tau_fall=p.tau_fall * tau,
    )


class DomainRandomization(Wrapper):
    """Draws new dynamics parameters at every reset of a `QuadrotorEnv`."""

    def __init__(self, env: Env, config: RandomizationConfig = RandomizationConfig()):
        super().__init__(env)
        config.validate()
        self.config = config

    def reset(self, rng: jax.Array) -> State:
        key_params, key_env = threefry.split(rng)
        quad = self.env.unwrapped
        params = randomize_params(key_params, quad.nominal_params, self.config)
        return quad.reset_with_params(key_env, params)


__all__ = [
    "HEAVY",
    "DomainRandomization",
    "RandomizationConfig",
    "heavy_disturbances",
    "randomize_params",
]
