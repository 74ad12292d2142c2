"""Initial-state distribution (20k vmapped resets of quadrotor-hover) and termination."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sim.quadrotor import InitConfig, QuadrotorConfig, QuadrotorEnv
from sim.quadrotor.params import GRAVITY

KS_P = 1e-3  # fixed seeds: a Kolmogorov–Smirnov p-value below this means a wrong distribution


@pytest.fixture(scope="module")
def starts(hover_resets):
    """numpy views of the 20k initial states: x [N, 17], mass [N], masks rest / moving."""
    r = hover_resets.data.rigid
    x = np.concatenate(
        [np.stack([np.asarray(c) for c in g], -1) for g in (r.pos, r.quat, r.vel, r.omega, r.rpm)],
        -1,
    ).astype(np.float64)
    rest = np.all(x[:, [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12]] == 0, axis=1) & (x[:, 3] == 1)
    return dict(x=x, rest=rest, moving=~rest, data=hover_resets.data)


def test_share_at_rest_on_target(starts):
    share = starts["rest"].mean()
    assert abs(share - 0.1) < 0.01  # binomial σ = 0.002 at n = 20k


def test_random_starts_within_bounds(starts):
    x = starts["x"][starts["moving"]]
    assert np.abs(x[:, 0:3]).max() <= 0.5 and np.abs(x[:, 0:3]).max() > 0.49
    assert np.abs(x[:, 7:10]).max() <= 1.0 and np.abs(x[:, 7:10]).max() > 0.99
    assert np.abs(x[:, 10:13]).max() <= 1.0 and np.abs(x[:, 10:13]).max() > 0.99
    np.testing.assert_allclose(np.linalg.norm(x[:, 3:7], axis=1), 1.0, atol=1e-6)
    for cols, half in ((slice(0, 3), 0.5), (slice(7, 10), 1.0), (slice(10, 13), 1.0)):
        v = x[:, cols]
        for axis in range(3):
            assert stats.kstest(v[:, axis], stats.uniform(-half, 2 * half).cdf).pvalue > KS_P


def tilt_cos(q: np.ndarray) -> np.ndarray:
    """cos of the angle between body z and world z: R22 = 1 − 2(x² + y²)."""
    return 1 - 2 * (q[:, 1] ** 2 + q[:, 2] ** 2)


def test_attitude_uniform_on_upper_hemisphere(starts):
    q = starts["x"][starts["moving"], 3:7]
    c = tilt_cos(q)
    assert c.min() >= -1e-6  # tilt ≤ 90° everywhere
    assert abs(c.mean() - 0.5) < 0.01  # body z uniform on the hemisphere ⇔ cos(tilt) ~ U(0, 1)
    assert stats.kstest(c, "uniform").pvalue > KS_P
    # Azimuth of body z and heading are uniform too (Haar measure restricted by tilt only).
    w, x, y, z = q.T
    azimuth = np.arctan2(2 * (y * z - w * x), 2 * (x * z + w * y))
    heading = np.arctan2(2 * (x * y + w * z), 1 - 2 * (y * y + z * z))
    for angle in (azimuth, heading):
        assert stats.kstest(angle, stats.uniform(-np.pi, 2 * np.pi).cdf).pvalue > KS_P


def test_rest_starts_are_exact(starts):
    x = starts["x"][starts["rest"]]
    np.testing.assert_array_equal(x[:, 3:7], np.tile([1.0, 0.0, 0.0, 0.0], (len(x), 1)))
    np.testing.assert_array_equal(x[:, [0, 1, 2, 7, 8, 9, 10, 11, 12]], 0.0)


def test_rotors_start_at_hover_and_disturbance_scale(starts):
    d = starts["data"]
    p = d.params
    mg = np.asarray(p.mass, np.float64) * GRAVITY
    u = starts["x"][:, 13:17] / np.asarray(p.rpm_max, np.float64)[:, None]
    c0, c1, c2 = (np.asarray(c, np.float64)[:, None] for c in p.thrust)
    np.testing.assert_allclose((c0 + c1 * u + c2 * u * u).sum(1), mg, rtol=1e-5)
    force = np.stack([np.asarray(f) for f in d.dist.force], -1) / mg[:, None]
    torque = np.stack([np.asarray(t) for t in d.dist.torque], -1) / mg[:, None]
    np.testing.assert_allclose(force.std(0), 1 / 20, rtol=0.03)  # σ = m g / 20 per axis
    np.testing.assert_allclose(torque.std(0), 1e-4, rtol=0.03)  # σ = m g / 1e4 per axis
    np.testing.assert_allclose(force.mean(0), 0.0, atol=4 * (1 / 20) / math.sqrt(len(force)))
    for axis in range(3):
        assert stats.kstest(force[:, axis] * 20, "norm").pvalue > KS_P


def test_action_history_starts_at_the_nominal_hover_command(hover_resets, starts):
    """The actor's history holds the nominal hover command after every reset, not the episode's
    randomized one: a deployed controller cannot know the randomized thrust curve."""
    env = QuadrotorEnv()
    nominal = 2.0 * float(env.nominal_params.hover_u) - 1.0
    hist = np.asarray(hover_resets.obs["state"][:, 18:])
    assert hist.shape[1] == 4 * env.config.action_history
    np.testing.assert_array_equal(hist, np.float32(nominal))
    randomized = 2.0 * np.asarray(starts["data"].params.hover_u) - 1.0
    assert randomized.std() > 0.01  # the episodes' own hover commands do differ


def test_track_starts_relative_to_the_moving_target():
    env = QuadrotorEnv(QuadrotorConfig(task="track", init=InitConfig(at_target_prob=1.0)))
    s = env.reset(jax.random.key(4))
    phase = float(s.data.phase)
    assert 0.0 <= phase <= env.config.track.period
    a, w = env.config.track.amplitude, 2 * math.pi / env.config.track.period
    pos = np.asarray(jnp.stack(s.data.rigid.pos))
    vel = np.asarray(jnp.stack(s.data.rigid.vel))
    np.testing.assert_allclose(
        pos, [a * math.sin(w * phase), a / 2 * math.sin(2 * w * phase), 0], atol=1e-6
    )
    np.testing.assert_allclose(
        vel, [a * w * math.cos(w * phase), a * w * math.cos(2 * w * phase), 0], atol=1e-6
    )


def test_small_max_tilt_is_uniform_within_the_cap():
    """With max_tilt_deg < 90, attitudes should be uniform within the cap, not often upright.

    Uses the sampler directly (a reset compiles for ~6 s on this CPU).
    """
    env = QuadrotorEnv(QuadrotorConfig(init=InitConfig(max_tilt_deg=20.0)))
    u = jax.random.uniform(jax.random.key(0), (3, 4000))
    q = np.asarray(
        jax.jit(lambda u: jnp.stack(env.attitude_from_uniforms(tuple(u), jnp.ones(()))))(u).T,
        np.float64,
    )
    c = tilt_cos(q)
    cap = math.cos(math.radians(20.0))
    assert c.min() >= cap - 1e-6
    # Uniform on the cap ⇔ cos(tilt) ~ U(cos 20°, 1); exactly upright has probability 0.
    assert np.mean(c == 1.0) < 1e-3
    assert stats.kstest(c, stats.uniform(cap, 1 - cap).cdf).pvalue > KS_P


# -- termination ---------------------------------------------------------------------------------
def _placed(env, state, pos=None, vel=None):
    f = jnp.float32
    r = state.data.rigid
    r = r.replace(
        pos=tuple(f(v) for v in pos) if pos is not None else r.pos,
        vel=tuple(f(v) for v in vel) if vel is not None else r.vel,
    )
    return state.replace(data=state.data.replace(rigid=r))


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_terminates_beyond_two_metres_on_any_axis(quiet_config, axis, sign):
    env = QuadrotorEnv(quiet_config)
    assert env.config.termination_distance == 2.0
    s0 = env.reset(jax.random.key(0))
    inside, outside = np.zeros(3), np.zeros(3)
    inside[axis], outside[axis] = sign * 1.95, sign * 2.05
    s = env.step(_placed(env, s0, inside), env.default_action)
    assert s.done == 0
    s = env.step(_placed(env, s0, outside), env.default_action)
    assert s.done == 1 and float(s.metrics["position_error"]) == pytest.approx(2.05, abs=1e-2)


def test_non_finite_state_terminates(quiet_config):
    env = QuadrotorEnv(quiet_config)
    s0 = env.reset(jax.random.key(0))
    for bad in (np.nan, np.inf):
        s = env.step(_placed(env, s0, vel=(0.0, bad, 0.0)), env.default_action)
        assert s.done == 1


def test_termination_distance_is_configurable(quiet_config):
    env = QuadrotorEnv(dataclasses.replace(quiet_config, termination_distance=0.6))
    s = env.step(_placed(env, env.reset(jax.random.key(0)), (0.0, 0.0, -0.65)), env.default_action)
    assert s.done == 1
