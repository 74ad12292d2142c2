"""Crazyflie 2.x physical parameters (../shared/reference/crazyflie.md).

Two parameter sets are provided: `cf2_l2f` (the "Learning to Fly in Seconds" paper, Crazyflie 2.0)
and `cf21_rltools` (later RLtools release: Crazyflie 2.1 with Flow and SD decks). Both are
expressed in
one thrust model, T_i = c0 + c1·u_i + c2·u_i² [N], with u_i = rpm_i / rpm_max ∈ [0, 1].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

GRAVITY = 9.81  # m/s², world z up


@struct.dataclass
class QuadParams:
    """Dynamics parameters of one quadrotor (each a traced scalar, randomizable per env).

    mass: [] kg. inertia: (Jxx, Jyy, Jzz) body-frame principal inertia, kg·m².
    thrust: (c0, c1, c2) thrust curve T = c0 + c1·u + c2·u², N, u = rpm/rpm_max.
    torque: [] yaw torque per thrust, N·m/N. tau_rise, tau_fall: [] motor time constants, s.
    rpm_max: [] maximum command, rpm. arm: [] rotor offset along body x and y, m.
    """

    mass: jax.Array
    inertia: tuple[jax.Array, jax.Array, jax.Array]
    thrust: tuple[jax.Array, jax.Array, jax.Array]
    torque: jax.Array
    tau_rise: jax.Array
    tau_fall: jax.Array
    rpm_max: jax.Array
    arm: jax.Array

    def as_vector(self) -> jax.Array:
        """[12] vector: mass, inertia×3, thrust×3, torque, tau_rise, tau_fall, rpm_max, arm."""
        return jnp.stack(
            [
                self.mass,
                *self.inertia,
                *self.thrust,
                self.torque,
                self.tau_rise,
                self.tau_fall,
                self.rpm_max,
                self.arm,
            ]
        )

    @property
    def hover_u(self) -> jax.Array:
        """[] normalized motor command whose four thrusts balance gravity."""
        c0, c1, c2 = self.thrust
        t = self.mass * GRAVITY / 4.0
        return (-c1 + jnp.sqrt(c1 * c1 - 4.0 * c2 * (c0 - t))) / (2.0 * c2)


PARAM_NAMES = (
    "mass",
    "inertia_x",
    "inertia_y",
    "inertia_z",
    "thrust_c0",
    "thrust_c1",
    "thrust_c2",
    "torque",
    "tau_rise",
    "tau_fall",
    "rpm_max",
    "arm",
)


def _make(mass, inertia, thrust, torque, tau_rise, tau_fall, rpm_max=21702.0, arm=0.028):
    f = jnp.float32
    return QuadParams(
        mass=f(mass),
        inertia=tuple(f(x) for x in inertia),
        thrust=tuple(f(x) for x in thrust),
        torque=f(torque),
        tau_rise=f(tau_rise),
        tau_fall=f(tau_fall),
        rpm_max=f(rpm_max),
        arm=f(arm),
    )


def cf2_l2f() -> QuadParams:
    """The L2F paper model: T = 3.16e-10·rpm², symmetric motor lag τ = 0.15 s."""
    return _make(
        0.027,
        (3.85e-6, 3.85e-6, 5.9675e-6),
        (0.0, 0.0, 3.16e-10 * 21702.0**2),
        0.005964552,
        0.15,
        0.15,
    )


def cf21_rltools() -> QuadParams:
    """Later RLtools model: Crazyflie 2.1 + Flow + SD deck, asymmetric motor lag."""
    return _make(
        0.0306,
        (9.4166e-6, 9.6441e-6, 1.74595e-5),
        (0.00352526, 0.01437313, 0.09223048),
        4.665e-3,
        0.0555,
        0.2494,
    )


PARAM_SETS = {"cf2_l2f": cf2_l2f, "cf21_rltools": cf21_rltools}


def get_params(name: str) -> QuadParams:
    if name not in PARAM_SETS:
        raise ValueError(
            f"unknown quadrotor parameter set {name!r}; choose from {sorted(PARAM_SETS)}"
        )
    return PARAM_SETS[name]()
