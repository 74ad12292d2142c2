"""The cascaded base controller: mixer inversion against the simulator's dynamics, hover, recovery
from a 60° tilt, and robust hovering under the default randomization."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sim
from algos.evaluate import summarize
from sim import make_env
from sim.quadrotor import (
    HEAVY,
    QuadrotorConfig,
    QuadrotorEnv,
    RandomizationConfig,
    dynamics,
    get_params,
    heavy_disturbances,
)
from sim.quadrotor.controller import (
    ControllerConfig,
    make_controller,
    mix,
    motor_commands,
    thrust_range,
)
from sim.quadrotor.params import GRAVITY


def _closed_loop(env, ctrl, state, steps):
    """Runs the controller on `state` (leaves [B, ...]) for `steps`; returns position error [T, B],
    done [T, B] (frozen after termination) and the final state."""

    def step(carry, _):
        s, cs, dead = carry
        a, cs = jax.vmap(ctrl.apply)(s.obs["state"], cs)
        s = jax.vmap(env.step)(s, a)
        dead = jnp.maximum(dead, s.done)
        return (s, cs, dead), {"position_error": s.metrics["position_error"], "done": dead}

    cs = jax.vmap(lambda _: ctrl.init())(state.done)
    (last, _, _), traj = jax.lax.scan(step, (state, cs, jnp.zeros_like(state.done)), None, steps)
    return traj, last


@pytest.mark.parametrize("name", ["cf2_l2f", "cf21_rltools"])
def test_mixer_inverts_through_the_dynamics(name):
    """Requested thrust/torques → motor commands → rotors at those speeds → the simulator's own
    thrust and torques (from `dynamics.derivative`) match."""
    p = get_params(name)
    t_min, t_max = (float(x) for x in thrust_range(p))
    rng = np.random.default_rng(0)
    hover = float(p.mass) * GRAVITY
    # Feasible requests: collective around hover, torques well inside the rotor range.
    thrust = rng.uniform(0.7, 1.3, 64) * hover
    spread = 0.2 * (t_max - t_min)
    torque = np.stack(
        [
            rng.uniform(-1, 1, 64) * spread * float(p.arm),
            rng.uniform(-1, 1, 64) * spread * float(p.arm),
            rng.uniform(-1, 1, 64) * 0.05 * hover * float(p.torque),
        ],
        -1,
    )
    thrusts = jax.vmap(lambda t, tau: mix(p, t, tau))(jnp.asarray(thrust), jnp.asarray(torque))
    assert np.all((thrusts > t_min) & (thrusts < t_max))
    cmd = motor_commands(p, thrusts)  # [64, 4] in [-1, 1]
    rpm = p.rpm_max * 0.5 * (cmd + 1.0)
    zero = jnp.zeros(64)
    s = dynamics.RigidState(
        pos=(zero,) * 3,
        quat=(zero + 1, zero, zero, zero),
        vel=(zero,) * 3,
        omega=(zero,) * 3,
        rpm=tuple(rpm.T),
    )
    dist = dynamics.Disturbance(force=(zero,) * 3, torque=(zero,) * 3)
    ds = jax.vmap(dynamics.derivative, in_axes=(None, 0, 0, 0))(p, dist, s, tuple(rpm.T))
    got_thrust = float(p.mass) * (np.asarray(ds.vel[2]) + GRAVITY)
    got_torque = np.stack(
        [np.asarray(a) * float(j) for a, j in zip(ds.omega, p.inertia, strict=True)], -1
    )
    np.testing.assert_allclose(got_thrust, thrust, rtol=1e-4)
    for axis in range(3):  # yaw torques are ~100× smaller than roll/pitch: per-axis tolerance
        scale = np.abs(torque[:, axis]).max()
        np.testing.assert_allclose(got_torque[:, axis], torque[:, axis], atol=1e-4 * scale)


def test_mixer_saturation_keeps_torque_direction():
    """An infeasible request keeps every rotor in range and the roll/pitch torque's direction."""
    p = get_params("cf2_l2f")
    t_min, t_max = thrust_range(p)
    torque = jnp.array([0.02, -0.01, 0.0])  # ~2.4× the roll authority of the rotors
    thrusts = mix(p, jnp.asarray(4 * t_max), torque)
    assert bool(jnp.all((thrusts >= t_min) & (thrusts <= t_max)))
    x, y = jnp.array(dynamics.ROTOR_X), jnp.array(dynamics.ROTOR_Y)
    got = jnp.array([p.arm * jnp.sum(y * thrusts), -p.arm * jnp.sum(x * thrusts)])
    cos = jnp.dot(got, torque[:2]) / (jnp.linalg.norm(got) * jnp.linalg.norm(torque[:2]))
    assert float(cos) > 0.999


def test_controller_config_rejects_bad_gains():
    with pytest.raises(ValueError, match="kp_xy"):
        make_controller(ControllerConfig(kp_xy=-1.0), 0.01)
    with pytest.raises(ValueError, match="min_acc_z"):
        make_controller(ControllerConfig(min_acc_z=-20.0), 0.01)
    with pytest.raises(ValueError, match="unknown quadrotor parameter set"):
        make_controller(ControllerConfig(params="cf3"), 0.01)


@pytest.fixture(scope="module")
def nominal(quiet_config):
    """(env, jitted closed loop of 400 steps on 8 envs): nominal dynamics, default observation
    noise, no disturbance, starting on the target (one compilation for the tests below)."""
    env = QuadrotorEnv(dataclasses.replace(quiet_config, noise=sim.quadrotor.NoiseConfig()))
    ctrl = make_controller(ControllerConfig(), env.dt)
    return env, jax.jit(lambda s: _closed_loop(env, ctrl, s, 400))


def test_hover_from_rest_stays_within_1cm(nominal):
    env, run = nominal
    state = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 8))
    traj, _ = run(state)
    assert float(traj["done"][-1].max()) == 0.0
    assert float(traj["position_error"].max()) < 0.01


def test_recovers_from_a_60_degree_tilt(nominal):
    """At the target, at rest, tilted 60° about 8 horizontal axes (random yaw): upright and back
    within 5 cm after 4 s, never terminated."""
    env, run = nominal
    n = 8
    az = jnp.arange(n) * 2 * math.pi / n
    yaw = jax.random.uniform(jax.random.key(1), (n,), maxval=2 * math.pi)
    half = math.radians(60) / 2
    q_tilt = (
        jnp.full(n, math.cos(half)),
        math.sin(half) * jnp.cos(az),
        math.sin(half) * jnp.sin(az),
    )
    q_tilt = (*q_tilt, jnp.zeros(n))
    quat = dynamics.quat_mul(q_tilt, (jnp.cos(yaw / 2), 0 * yaw, 0 * yaw, jnp.sin(yaw / 2)))
    state = jax.vmap(env.reset)(jax.random.split(jax.random.key(2), n))
    state = state.replace(data=state.data.replace(rigid=state.data.rigid.replace(quat=quat)))
    # One hover-command step refreshes the observation with the tilted attitude.
    state = jax.vmap(env.step)(state, jnp.broadcast_to(env.default_action, (n, 4)))
    traj, last = run(state)
    _, qx, qy, _ = last.data.rigid.quat
    tilt = jnp.degrees(jnp.arccos(1 - 2 * (qx**2 + qy**2)))
    assert float(traj["done"][-1].max()) == 0.0
    assert float(traj["position_error"][-1].max()) < 0.05, traj["position_error"][-1]
    assert float(tilt.max()) < 5.0
    assert float(traj["position_error"].max()) > 0.05  # the tilt did push it away


def test_hovers_under_default_randomization():
    """The evaluation protocol on 200 episodes: wide initial states (up to 90° tilt, ±0.5 m,
    ±1 m/s, ±1 rad/s), ±10 % dynamics, disturbances, observation noise (on 1000 episodes:
    99.4 % success, 0 terminations)."""
    env = sim.make_env("quadrotor-hover")
    ctrl = make_controller(ControllerConfig(), env.dt)
    state = jax.vmap(env.reset)(jax.random.split(jax.random.key(12345), 200))
    traj, _ = jax.jit(lambda s: _closed_loop(env, ctrl, s, 500))(state)
    summary = summarize(traj, 200, 0.1)
    assert summary["termination_rate"] == 0.0, summary
    assert summary["success_rate"] >= 0.95, summary


def test_heavy_randomization_shifts_the_model():
    """Mass +30 %, motor τ ×2 (each around the default ±10 % draw), disturbance σ ×3, rotors
    starting at the heavy hover speed."""
    env = make_env("quadrotor-hover", heavy_disturbances(QuadrotorConfig()), HEAVY)
    s = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(7), 2000))
    p, nominal = s.data.params, get_params("cf2_l2f")
    mass = np.asarray(p.mass / nominal.mass)
    tau = np.asarray(p.tau_rise / nominal.tau_rise)
    assert 1.3 * 0.9 - 1e-6 <= mass.min() and mass.max() <= 1.3 * 1.1 + 1e-6
    assert abs(mass.mean() - 1.3) < 0.01
    assert 1.8 - 1e-6 <= tau.min() and tau.max() <= 2.2 + 1e-6
    np.testing.assert_allclose(p.tau_fall / nominal.tau_fall, tau, rtol=1e-6)
    force = np.stack(s.data.dist.force, -1) / np.asarray(p.mass * GRAVITY)[:, None]
    assert abs(force.std() - 3 / 20) < 0.01
    np.testing.assert_allclose(s.data.rigid.rpm[0], p.hover_u * p.rpm_max, rtol=1e-5)
    with pytest.raises(ValueError, match="mass_shift"):
        make_env("quadrotor-hover", randomization=RandomizationConfig(mass_shift=0.0))
