"""Crazyflie rigid-body and motor dynamics, integrated with RK4.

Structure of arrays: every vector is a tuple of scalar arrays, so a vmapped batch holds one
contiguous [N] array per state component and one step compiles to one fused, bandwidth-bound loop.

Equations (world frame z up, body frame x forward, y left, z up; w-first quaternion body→world):
  ṗ = v
  q̇ = ½ q ⊗ (0, ω)
  v̇ = R(q)·(0, 0, ΣTᵢ)/m + g + f_d/m
  ω̇ = J⁻¹(τ + τ_d − ω × Jω)
  ṙpmᵢ = (rpm_cmdᵢ − rpmᵢ)/τ_m,   τ_m = τ_rise if rpm_cmdᵢ > rpmᵢ else τ_fall
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from sim.quadrotor.params import GRAVITY, QuadParams

Vec3 = tuple[jax.Array, jax.Array, jax.Array]
Quat = tuple[jax.Array, jax.Array, jax.Array, jax.Array]
Vec4 = tuple[jax.Array, jax.Array, jax.Array, jax.Array]

# Firmware motor order M1..M4: rotor x/y signs (times the arm) and yaw-torque signs.
ROTOR_X = (1.0, -1.0, -1.0, 1.0)
ROTOR_Y = (-1.0, -1.0, 1.0, 1.0)
ROTOR_YAW = (-1.0, 1.0, -1.0, 1.0)


@struct.dataclass
class RigidState:
    """pos: world m. quat: (w, x, y, z) body→world. vel: world m/s. omega: body rad/s.
    rpm: 4 rotor speeds, rpm."""

    pos: Vec3
    quat: Quat
    vel: Vec3
    omega: Vec3
    rpm: Vec4


@struct.dataclass
class Disturbance:
    """Constant per-episode disturbance: force (world, N) and torque (body, N·m)."""

    force: Vec3
    torque: Vec3


def cross(a: Vec3, b: Vec3) -> Vec3:
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def quat_mul(a: Quat, b: Quat) -> Quat:
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return (
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    )


def rotation_matrix(q: Quat) -> tuple[jax.Array, ...]:
    """Row-major 3×3 rotation matrix R(q) (body→world) as 9 scalars."""
    w, x, y, z = q
    return (
        1 - 2 * (y * y + z * z),
        2 * (x * y - w * z),
        2 * (x * z + w * y),
        2 * (x * y + w * z),
        1 - 2 * (x * x + z * z),
        2 * (y * z - w * x),
        2 * (x * z - w * y),
        2 * (y * z + w * x),
        1 - 2 * (x * x + y * y),
    )


def rotor_thrusts(params: QuadParams, rpm: Vec4) -> Vec4:
    """Per-rotor thrust [N] along body z."""
    c0, c1, c2 = params.thrust
    u = tuple(r / params.rpm_max for r in rpm)
    return tuple(c0 + (c1 + c2 * ui) * ui for ui in u)


def derivative(params: QuadParams, dist: Disturbance, s: RigidState, rpm_cmd: Vec4) -> RigidState:
    """Time derivative of the state for a constant motor command `rpm_cmd` (4 × rpm)."""
    t = rotor_thrusts(params, s.rpm)
    total = t[0] + t[1] + t[2] + t[3]
    arm = params.arm
    tau = (
        arm * sum(sy * ti for sy, ti in zip(ROTOR_Y, t, strict=True)),
        -arm * sum(sx * ti for sx, ti in zip(ROTOR_X, t, strict=True)),
        params.torque * sum(sz * ti for sz, ti in zip(ROTOR_YAW, t, strict=True)),
    )
    w, x, y, z = s.quat
    # Thrust direction: third column of R(q).
    zb = (2 * (x * z + w * y), 2 * (y * z - w * x), 1 - 2 * (x * x + y * y))
    inv_m = 1.0 / params.mass
    acc = (
        (zb[0] * total + dist.force[0]) * inv_m,
        (zb[1] * total + dist.force[1]) * inv_m,
        (zb[2] * total + dist.force[2]) * inv_m - GRAVITY,
    )
    j = params.inertia
    om = s.omega
    gyro = cross(om, (j[0] * om[0], j[1] * om[1], j[2] * om[2]))
    alpha = tuple((tau[i] + dist.torque[i] - gyro[i]) / j[i] for i in range(3))
    half = quat_mul(s.quat, (jnp.zeros_like(om[0]), *om))
    qdot = tuple(0.5 * c for c in half)
    rpm_dot = tuple(
        (c - r) / jnp.where(c > r, params.tau_rise, params.tau_fall)
        for c, r in zip(rpm_cmd, s.rpm, strict=True)
    )
    return RigidState(pos=s.vel, quat=qdot, vel=acc, omega=alpha, rpm=rpm_dot)


def _axpy(a: float, dx: RigidState, x: RigidState) -> RigidState:
    return jax.tree.map(lambda xi, di: xi + a * di, x, dx)


def rk4_step(
    params: QuadParams, dist: Disturbance, s: RigidState, rpm_cmd: Vec4, dt: float
) -> RigidState:
    """One classical RK4 step of length `dt`, then quaternion renormalization and rpm clamp."""
    k1 = derivative(params, dist, s, rpm_cmd)
    k2 = derivative(params, dist, _axpy(0.5 * dt, k1, s), rpm_cmd)
    k3 = derivative(params, dist, _axpy(0.5 * dt, k2, s), rpm_cmd)
    k4 = derivative(params, dist, _axpy(dt, k3, s), rpm_cmd)
    incr = jax.tree.map(lambda a, b, c, d: (a + 2 * b + 2 * c + d) * (dt / 6.0), k1, k2, k3, k4)
    n = jax.tree.map(jnp.add, s, incr)
    qn = jnp.sqrt(sum(c * c for c in n.quat))
    return n.replace(
        quat=tuple(c / qn for c in n.quat),
        rpm=tuple(jnp.clip(r, 0.0, params.rpm_max) for r in n.rpm),
    )


def integrate(
    params: QuadParams, dist: Disturbance, s: RigidState, action: Vec4, dt: float, substeps: int
) -> RigidState:
    """Advances one control period `dt` with `substeps` RK4 steps; `action` ∈ [-1, 1]⁴.

    rpm_cmd = rpm_max·(a + 1)/2 (the L2F convention), held constant over the period.
    """
    rpm_cmd = tuple(params.rpm_max * 0.5 * (jnp.clip(a, -1.0, 1.0) + 1.0) for a in action)
    h = dt / substeps
    for _ in range(substeps):
        s = rk4_step(params, dist, s, rpm_cmd, h)
    return s
