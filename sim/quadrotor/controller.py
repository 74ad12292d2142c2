"""Cascaded geometric controller with the Crazyflie's default structure (a base policy for residual
RL and a classical baseline).

position PID → desired acceleration → thrust vector F = m(a_des + g ẑ) → desired attitude
(body z along F, yaw 0) and collective thrust T = F·z_b (Mellinger & Kumar, ICRA 2011; Lee, Leok &
McClamroch, CDC 2010; the Crazyflie firmware's `controller_mellinger.c`) → attitude P on SO(3) →
body-rate setpoint → rate PI with gyroscopic feedforward, τ = J(k_ω(ω_d − ω) + ∫) + ω × Jω →
X-configuration mixer → per-motor thrusts → inverse thrust curve T_i = c0 + c1·u + c2·u² →
normalized commands a = 2u − 1 ∈ [-1, 1].

Two departures from the firmware, both needed by the L2F model and its wide initial states:
- the attitude error is tilt-prioritized (z_b onto z_d along the shortest arc, yaw separately, as
  in PX4 and Brescianini & D'Andrea, "Tilt-prioritized quadrocopter attitude control", 2020):
  Lee's e_R = ½ vee(R_dᵀR − RᵀR_d) loses roll/pitch authority as the yaw error nears 180°, and the
  initial yaw is uniform;
- motor-lag compensation: with τ = 0.15 s rotors (the Crazyflie's are ~10× faster) the loops
  above must otherwise be slowed to a fraction of a rad/s; the controller tracks a rotor-speed
  estimate from the applied commands and leads it (`ControllerConfig.motor_tau_c`, None: off).

It reads the actor observation (layout `sim.quadrotor.OBS_FIELDS`, noise included, so it runs on
what a deployed controller sees) and uses the *nominal* parameters only: randomized mass, thrust
and disturbances are left to the integral terms (and to a residual policy).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from sim.quadrotor.dynamics import ROTOR_X, ROTOR_Y, ROTOR_YAW
from sim.quadrotor.params import GRAVITY, QuadParams, get_params

# numpy, not jnp: a jnp constant at import would start JAX's backend, after which XLA_FLAGS that
# callers set (benchmarks/sac_vs_ppo.py, algos.default_xla_flag) no longer take effect
_ROTOR_X = np.asarray(ROTOR_X, np.float32)
_ROTOR_Y = np.asarray(ROTOR_Y, np.float32)
_ROTOR_YAW = np.asarray(ROTOR_YAW, np.float32)


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """Gains of the cascaded controller, tuned by hand on `quadrotor-hover` under the default
    randomization with the evaluation protocol (1000 episodes: 99.4 % success, 0 terminations)."""

    params: Literal["cf2_l2f", "cf21_rltools"] = "cf2_l2f"
    """Nominal parameter set the controller believes in (mass, inertia, thrust curve, arm)."""
    kp_xy: float = 6.0
    """Horizontal position gain, (m/s²)/m."""
    kd_xy: float = 4.0
    """Horizontal velocity gain, (m/s²)/(m/s)."""
    ki_xy: float = 3.0
    """Horizontal position integral gain, (m/s²)/(m·s)."""
    kp_z: float = 6.0
    """Vertical position gain, (m/s²)/m."""
    kd_z: float = 4.0
    """Vertical velocity gain, (m/s²)/(m/s)."""
    ki_z: float = 6.0
    """Vertical position integral gain, (m/s²)/(m·s)."""
    i_limit: float = 4.0
    """Clamp of each axis' integral term, m/s² (anti-windup)."""
    i_error_limit: float = 0.2
    """Clamp of the position error fed to the integrator, m (slows windup far from the target)."""
    max_tilt_deg: float = 40.0
    """Largest tilt the position loop asks for: |a_xy| ≤ g·tan(max_tilt)."""
    min_acc_z: float = -5.0
    """Lowest vertical acceleration the position loop asks for, m/s² (> −g keeps F upward)."""
    k_att: float = 8.0
    """Roll/pitch attitude gain k_R, (rad/s)/rad."""
    k_att_yaw: float = 3.0
    """Yaw attitude gain, (rad/s)/rad."""
    max_rate: float = 8.0
    """Clamp of the body-rate setpoint, rad/s."""
    k_rate: float = 25.0
    """Roll/pitch rate gain k_ω, (rad/s²)/(rad/s)."""
    k_rate_yaw: float = 20.0
    """Yaw rate gain, (rad/s²)/(rad/s)."""
    ki_rate: float = 20.0
    """Rate integral gain (all axes), (rad/s²)/rad."""
    rate_i_limit: float = 20.0
    """Clamp of each axis' rate integral term, rad/s²."""
    thrust_floor: float = 0.5
    """Collective thrust T = |F|·max(z_b·z_d, floor): 0 is Mellinger's projection T = F·z_b; a
    floor keeps the (slow) rotors spinning while the attitude is far from the desired one."""
    motor_tau_c: float | None = 0.04
    """Motor-lag compensation: the rotors (first-order lag τ, 0.15 s in the L2F model) are driven
    so that the *estimated* rotor speed reaches the mixer's setpoint with time constant
    `motor_tau_c`, s; None sends the setpoint as is (the firmware's behaviour)."""
    yaw_share: float = 0.3
    """Largest per-motor thrust change the yaw torque may use, as a fraction of hover thrust."""

    def validate(self) -> None:
        gains = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del gains["params"], gains["min_acc_z"], gains["motor_tau_c"]
        bad = [k for k, v in gains.items() if not (v >= 0 and math.isfinite(v))]
        if bad:
            raise ValueError(f"controller gains must be finite and ≥ 0: {', '.join(bad)}")
        if not -GRAVITY < self.min_acc_z <= 0:
            raise ValueError(f"min_acc_z must be in (−g, 0], got {self.min_acc_z}")
        if self.motor_tau_c is not None and not self.motor_tau_c > 0:
            raise ValueError(f"motor_tau_c must be > 0 or None, got {self.motor_tau_c}")
        if not 0 < self.max_tilt_deg < 90:
            raise ValueError(f"max_tilt_deg must be in (0, 90), got {self.max_tilt_deg}")
        get_params(self.params)


@struct.dataclass
class ControllerState:
    """pos_integral: [3] world, m/s², the integral term of the position PID (gain included).
    rate_integral: [3] body, rad/s², the integral term of the rate PI (gain included).
    motor: [4] estimated normalized rotor speeds u = rpm/rpm_max ∈ [0, 1] (motor order M1..M4)."""

    pos_integral: jax.Array
    rate_integral: jax.Array
    motor: jax.Array


class Controller(NamedTuple):
    """Pure functions of a stateful controller (the base-policy interface of `algos.residual`).

    init() -> ControllerState (zero integrals, at the start of each episode)
    apply(obs [obs_size], cs) -> (action [4] in [-1, 1], cs)  (unbatched; vmap for batches)
    """

    init: Callable[[], ControllerState]
    apply: Callable[[jax.Array, ControllerState], tuple[jax.Array, ControllerState]]


# -- mixer ------------------------------------------------------------------------------------
def thrust_range(params: QuadParams) -> tuple[jax.Array, jax.Array]:
    """(min, max) thrust of one rotor, N: the thrust curve at u = 0 and u = 1."""
    c0, c1, c2 = params.thrust
    return c0, c0 + c1 + c2


def mix(
    params: QuadParams, thrust: jax.Array, torque: jax.Array, yaw_share: float = 1.0
) -> jax.Array:
    """Per-rotor thrusts [4] (N, motor order M1..M4) giving collective `thrust` [] (N, body z) and
    `torque` [3] (N·m, body) on the X configuration of `sim.quadrotor.dynamics`:

      T = Σ tᵢ,  τx = arm Σ yᵢ tᵢ,  τy = −arm Σ xᵢ tᵢ,  τz = k Σ sᵢ tᵢ   (x, y, s: ±1 signs)
      ⇒ tᵢ = T/4 + yᵢ τx/(4 arm) − xᵢ τy/(4 arm) + sᵢ τz/(4k)   (the sign rows are orthogonal).

    Exact when every tᵢ is within `thrust_range` and |sᵢ τz/(4k)| ≤ yaw_share·T_hover/4. Otherwise,
    attitude first: the yaw part is clamped to that share, the torque part is scaled down until its
    spread fits the range, then the collective is moved (not the torques) to fit.
    """
    t_min, t_max = thrust_range(params)
    arm, k = params.arm, params.torque
    d_rp = _ROTOR_Y * torque[0] / (4 * arm) - _ROTOR_X * torque[1] / (4 * arm)
    yaw_lim = yaw_share * params.mass * GRAVITY / 4.0
    yaw = jnp.clip(torque[2] / (4 * k), -yaw_lim, yaw_lim)
    return _fit(thrust / 4.0, d_rp + _ROTOR_YAW * yaw, t_min, t_max)


def _fit(mean: jax.Array, d: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """mean + d [4] inside [lo, hi], differential part first: d is scaled down until its spread
    fits, then the common part is moved (not d) to fit."""
    spread = jnp.max(d) - jnp.min(d)
    d = d * jnp.minimum(1.0, (hi - lo) / jnp.maximum(spread, 1e-12))
    return jnp.clip(jnp.clip(mean, lo - jnp.min(d), hi - jnp.max(d)) + d, lo, hi)


def rotor_speeds(params: QuadParams, thrusts: jax.Array) -> jax.Array:
    """Normalized rotor speeds u [4] ∈ [0, 1] whose thrusts are `thrusts` [4] (N):
    u = (−c1 + √(c1² + 4c2(t − c0)))/(2c2) inverts t = c0 + c1·u + c2·u²."""
    c0, c1, c2 = params.thrust
    disc = jnp.maximum(c1 * c1 + 4.0 * c2 * (thrusts - c0), 0.0)
    return jnp.clip((-c1 + jnp.sqrt(disc)) / (2.0 * c2), 0.0, 1.0)


def motor_commands(params: QuadParams, thrusts: jax.Array) -> jax.Array:
    """Normalized commands a = 2u − 1 [4] ∈ [-1, 1] whose steady-state rotor thrusts are
    `thrusts` [4] (N) (`rotor_speeds`, then the env's rpm_cmd = rpm_max·(a + 1)/2)."""
    return 2.0 * rotor_speeds(params, thrusts) - 1.0


# -- controller -------------------------------------------------------------------------------
def make_controller(cfg: ControllerConfig, dt: float) -> Controller:
    """The cascaded controller at control period `dt` (s) with the nominal `cfg.params`."""
    cfg.validate()
    p = get_params(cfg.params)
    mass = p.mass
    inertia = jnp.stack(p.inertia)
    kp = jnp.array([cfg.kp_xy, cfg.kp_xy, cfg.kp_z])
    kd = jnp.array([cfg.kd_xy, cfg.kd_xy, cfg.kd_z])
    ki = jnp.array([cfg.ki_xy, cfg.ki_xy, cfg.ki_z])
    k_att = jnp.array([cfg.k_att, cfg.k_att, cfg.k_att_yaw])
    k_rate = jnp.array([cfg.k_rate, cfg.k_rate, cfg.k_rate_yaw])
    hover_u = p.hover_u
    # Exact discretization of u̇ = (u_cmd − u)/τ over one period: u' = u + α(u_cmd − u).
    alpha_rise, alpha_fall = (1.0 - jnp.exp(-dt / t) for t in (p.tau_rise, p.tau_fall))
    alpha_c = 1.0 - math.exp(-dt / cfg.motor_tau_c) if cfg.motor_tau_c else None
    max_acc_xy = GRAVITY * math.tan(math.radians(cfg.max_tilt_deg))
    t_max = 4.0 * thrust_range(p)[1]

    def init() -> ControllerState:
        return ControllerState(jnp.zeros(3), jnp.zeros(3), jnp.full((4,), hover_u))

    def apply(obs: jax.Array, cs: ControllerState) -> tuple[jax.Array, ControllerState]:
        e_p, rot, e_v, omega = obs[0:3], obs[3:12].reshape(3, 3), obs[12:15], obs[15:18]
        # Position PID → desired acceleration (world), with anti-windup and tilt/fall limits.
        e_i = jnp.clip(e_p, -cfg.i_error_limit, cfg.i_error_limit)
        i_p = jnp.clip(cs.pos_integral - ki * e_i * dt, -cfg.i_limit, cfg.i_limit)
        acc = -kp * e_p - kd * e_v + i_p
        acc_xy = acc[:2] * jnp.minimum(1.0, max_acc_xy / (jnp.linalg.norm(acc[:2]) + 1e-9))
        acc = jnp.concatenate([acc_xy, jnp.maximum(acc[2:], cfg.min_acc_z)])
        force = mass * (acc + jnp.array([0.0, 0.0, GRAVITY]))  # world, N
        # Desired attitude: body z along F, yaw 0; T = F·z_b (Mellinger), floored at a fraction
        # of |F| so that the slow rotors keep spinning while the attitude error is large.
        f_norm = jnp.linalg.norm(force)
        z_d, z_b = force / f_norm, rot[:, 2]
        thrust = jnp.clip(f_norm * jnp.maximum(z_d @ z_b, cfg.thrust_floor), 0.0, t_max)
        # Attitude P on SO(3), tilt first: rotate z_b onto z_d along the shortest arc (body-frame
        # axis Rᵀ(z_b × z_d), angle θ), and yaw (heading ψ = atan2(R10, R00)) towards 0 on its own.
        axis = rot.T @ jnp.cross(z_b, z_d)
        sin_t = jnp.linalg.norm(axis)
        theta = jnp.arctan2(sin_t, z_d @ z_b)
        yaw = jnp.arctan2(rot[1, 0], rot[0, 0])
        omega_d = k_att * jnp.concatenate([axis[:2] * theta / (sin_t + 1e-9), -yaw[None]])
        omega_d = jnp.clip(omega_d, -cfg.max_rate, cfg.max_rate)
        # Rate PI → torque (body) with gyroscopic feedforward ω × Jω.
        e_w = omega_d - omega
        i_w = jnp.clip(
            cs.rate_integral + cfg.ki_rate * e_w * dt, -cfg.rate_i_limit, cfg.rate_i_limit
        )
        torque = inertia * (k_rate * e_w + i_w) + jnp.cross(omega, inertia * omega)
        u_set = rotor_speeds(p, mix(p, thrust, torque, cfg.yaw_share))
        u_cmd, motor = _compensate_lag(obs, cs.motor, u_set)
        return 2.0 * u_cmd - 1.0, ControllerState(i_p, i_w, motor)

    def _compensate_lag(obs, motor, u_set):
        """Rotor-speed estimate advanced with the last *applied* command (the observation's
        action history, so corrections added to our command are accounted for), then the command
        that moves it to `u_set` with time constant `motor_tau_c`: u_cmd = û + (α_c/α)(u_set − û).
        """
        if alpha_c is None:
            return u_set, motor
        if obs.shape[-1] < 22:
            raise ValueError("motor-lag compensation needs the action history (action_history ≥ 1)")
        last = 0.5 * (obs[18:22] + 1.0)
        motor = motor + jnp.where(last > motor, alpha_rise, alpha_fall) * (last - motor)
        alpha = jnp.where(u_set > motor, alpha_rise, alpha_fall)
        u_cmd = motor + (alpha_c / alpha) * (u_set - motor)
        return _fit(jnp.mean(u_cmd), u_cmd - jnp.mean(u_cmd), 0.0, 1.0), motor

    return Controller(init, apply)


__all__ = [
    "Controller",
    "ControllerConfig",
    "ControllerState",
    "make_controller",
    "mix",
    "motor_commands",
    "rotor_speeds",
    "thrust_range",
]
