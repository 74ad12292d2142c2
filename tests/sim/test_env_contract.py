"""The STYLE.md §2 env contract, over every registered task, plus the quadrotor MDP's layout."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

import sim
from sim.quadrotor import InitConfig, QuadrotorConfig, QuadrotorEnv, RewardConfig
from sim.quadrotor.params import GRAVITY

TERMS = (
    "position",
    "position_l1",
    "orientation",
    "velocity",
    "angular_velocity",
    "action",
    "alive",
)


def all_finite(tree) -> bool:
    return all(
        bool(jnp.all(jnp.isfinite(x)))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(x.dtype, jnp.floating)
    )


def tree_equal(a, b) -> bool:
    """Bitwise equality of two pytrees (PRNG keys compared by their key data)."""

    def raw(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    la, lb = jax.tree.leaves(jax.tree.map(raw, a)), jax.tree.leaves(jax.tree.map(raw, b))
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


# The quadrotor family's contract; the arm's is in tests/sim/manipulator/test_env.py.
QUAD_TASKS = sorted(t for t in sim.TASKS if t.startswith("quadrotor-"))


def test_registry():
    assert set(sim.TASKS) == {
        "quadrotor-hover",
        "quadrotor-track",
        "arm-reach",
        "arm-push",
        "arm-pick-place",
    }
    with pytest.raises(ValueError, match="unknown task"):
        sim.make_env("quadrotor-backflip")


@pytest.mark.parametrize("task", QUAD_TASKS)
def test_contract_under_jit_and_vmap(task, random_episodes):
    """jit(vmap(reset, then scan(step))) over 20k keys with uniformly random actions, 1 s."""
    env, first, last, (reward, done, metrics), keys, _ = random_episodes(task)
    n, t_len = reward.shape
    assert env.action_size == 4 and env.dt == pytest.approx(0.01)
    assert env.default_action.shape == (4,)
    for state in (first, last):
        assert set(state.obs) == {"state", "privileged_state"}
        for k, shape in env.observation_size.items():
            assert state.obs[k].shape == (n, *shape), k
        for x in (state.reward, state.done):
            assert x.shape == (n,) and x.dtype == jnp.float32
        assert set(state.metrics) == {f"reward/{t}" for t in TERMS} | {"position_error"}
        assert all(m.shape == (n,) for m in state.metrics.values())
        assert {"rng", "progress"} <= set(state.info)
        assert all_finite((state.data, state.obs, state.reward, state.metrics))
    assert all_finite((reward, metrics)) and set(metrics) == set(last.metrics)
    assert all(m.shape == (n, t_len) for m in metrics.values())
    assert set(np.unique(np.asarray(done))) == {0.0, 1.0}
    # Full-range random actions crash some drones within 1 s; without an auto-reset wrapper
    # termination is sticky (they keep flying away from the target).
    assert np.all(np.diff(np.asarray(done), axis=1) >= 0)
    # Not terminated ⇒ reward is the sum of the logged terms.
    total = sum(np.asarray(metrics[f"reward/{t}"]) for t in TERMS)
    alive = np.asarray(done) == 0
    np.testing.assert_allclose(np.asarray(reward)[alive], total[alive], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("task", QUAD_TASKS)
def test_unbatched_eager_matches_vmapped(task, random_episodes):
    """The env is written unbatched: eager reset/step of one env equals its row of the batch."""
    env, first, _, (reward, _, _), keys, _ = random_episodes(task)
    i = 3
    key_reset, key_act = jax.random.split(keys[i])
    s = env.reset(key_reset)
    assert s.reward.shape == () and s.obs["state"].shape == env.observation_size["state"]
    row = jax.tree.map(lambda x: x[i], first)
    for a, b in zip(
        jax.tree.leaves((s.data, s.obs)), jax.tree.leaves((row.data, row.obs)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    actions = jax.random.uniform(key_act, (100, 4), minval=-1.0, maxval=1.0)
    for t in range(3):
        s = env.step(s, actions[t])
        assert float(s.reward) == pytest.approx(float(reward[i, t]), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("task", QUAD_TASKS)
def test_same_key_same_trajectory(task, random_episodes):
    episodes = random_episodes(task)
    again = episodes.run(episodes.keys)
    assert tree_equal((episodes.first, episodes.last, episodes.steps), again)
    pos = np.asarray(episodes.last.data.rigid.pos[0])
    assert len(np.unique(pos)) > 0.999 * len(pos)  # different keys, different episodes


def rigid_vector(rigid) -> np.ndarray:
    return np.concatenate(
        [
            np.asarray(jnp.stack(x))
            for x in (rigid.pos, rigid.quat, rigid.vel, rigid.omega, rigid.rpm)
        ]
    )


def test_hover_at_rest_stays_put(quiet_config):
    env = QuadrotorEnv(quiet_config)
    s = env.reset(jax.random.key(0))
    x0 = rigid_vector(s.data.rigid)
    np.testing.assert_array_equal(x0[:13], [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    for _ in range(100):
        s = env.step(s, env.default_action)
        assert s.done == 0
        # At rest on target: only the alive bonus, minus round-off.
        assert float(s.reward) == pytest.approx(2.0, abs=1e-4)
    x = rigid_vector(s.data.rigid)
    assert np.abs(x[:3]).max() < 3e-3 and np.abs(x[7:13]).max() < 3e-3


def _quiet(cfg: QuadrotorConfig, **kw) -> QuadrotorEnv:
    return QuadrotorEnv(dataclasses.replace(cfg, **kw))


def test_action_history_in_observation(quiet_config):
    env = _quiet(quiet_config, action_history=3)
    assert env.observation_size == {"state": (30,), "privileged_state": (30 + 4 + 6 + 12,)}
    s = env.reset(jax.random.key(0))
    hover = np.asarray(env.default_action)
    np.testing.assert_array_equal(s.obs["state"][18:], np.tile(hover, 3))
    a0 = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    a1 = np.array([1.5, -2.0, -0.5, 0.0], np.float32)  # recorded clipped to [-1, 1]
    s = env.step(env.step(s, a0), a1)
    want = np.concatenate([np.clip(a1, -1, 1), a0, hover])
    np.testing.assert_array_equal(s.obs["state"][18:], want)
    np.testing.assert_array_equal(s.obs["privileged_state"][18:30], want)

    env0 = _quiet(quiet_config, action_history=0)
    assert env0.observation_size == {"state": (18,), "privileged_state": (40,)}
    s = env0.step(env0.reset(jax.random.key(0)), a0)
    assert s.obs["state"].shape == (18,) and s.obs["privileged_state"].shape == (40,)


def test_action_delay_shifts_motor_response(quiet_config):
    """With delay 2 the motors see the command issued two control steps earlier (hover before)."""
    env0, env2 = _quiet(quiet_config, action_delay=0), _quiet(quiet_config, action_delay=2)
    hover = np.asarray(env0.default_action)
    actions = (hover + np.random.default_rng(0).uniform(-0.3, 0.3, (8, 4))).astype(np.float32)
    shifted = np.concatenate([[hover, hover], actions[:-2]])

    def rpms(env, acts):
        s, out = env.reset(jax.random.key(5)), []
        for a in acts:
            s = env.step(s, a)
            out.append(np.asarray(jnp.stack(s.data.rigid.rpm)))
        return np.array(out), s

    r2, s2 = rpms(env2, actions)
    r0_shifted, _ = rpms(env0, shifted)
    r0, _ = rpms(env0, actions)
    np.testing.assert_allclose(r2, r0_shifted, rtol=1e-6)
    np.testing.assert_allclose(r2[:2], np.tile(r2[0], (2, 1)), rtol=1e-6)  # still at hover
    assert np.abs(r2 - r0).max() > 100.0  # rpm: the delay is not a no-op
    # The observation records the commanded (not the applied) action, most recent first.
    np.testing.assert_array_equal(s2.obs["state"][18:22], actions[-1])


def reference_target(cfg: QuadrotorConfig, t: float):
    """Figure eight p(t) = (A sin ωt, (A/2) sin 2ωt, 0) of TrackConfig, and its derivative."""
    if cfg.task == "hover":
        return np.zeros(3), np.zeros(3)
    a, w = cfg.track.amplitude, 2 * math.pi / cfg.track.period
    return (
        np.array([a * math.sin(w * t), 0.5 * a * math.sin(2 * w * t), 0.0]),
        np.array([a * w * math.cos(w * t), a * w * math.cos(2 * w * t), 0.0]),
    )


@pytest.mark.parametrize("task", QUAD_TASKS)
def test_observation_layout(task, quiet_config):
    cfg = dataclasses.replace(
        quiet_config, task=sim.TASKS[task], action_history=2, init=InitConfig(at_target_prob=0.0)
    )
    env = sim.make_env(task, cfg)  # with domain randomization
    s = env.reset(jax.random.key(3))
    a = np.array([0.3, -0.2, 0.1, 0.0], np.float32)
    for _ in range(3):
        s = env.step(s, a)
    d = s.data
    x = rigid_vector(d.rigid).astype(np.float64)
    t = int(d.step) * cfg.ctrl_dt + float(d.phase)
    assert int(d.step) == 3
    tp, tv = reference_target(cfg, t)
    rot = Rotation.from_quat(x[3:7], scalar_first=True).as_matrix()  # w-first, body→world
    clean = np.concatenate([x[0:3] - tp, rot.reshape(-1), x[7:10] - tv, x[10:13]])
    hover = np.asarray(2 * d.params.hover_u - 1)
    hist = np.concatenate([a, a])
    obs = np.asarray(s.obs["state"], np.float64)
    priv = np.asarray(s.obs["privileged_state"], np.float64)
    np.testing.assert_allclose(obs[:18], clean, atol=1e-5)
    np.testing.assert_allclose(obs[18:], hist, atol=0)
    p = d.params
    mg = float(p.mass) * GRAVITY
    dist = np.concatenate(
        [np.asarray(jnp.stack(d.dist.force)), np.asarray(jnp.stack(d.dist.torque))]
    )
    np.testing.assert_allclose(priv[:18], clean, atol=1e-5)
    np.testing.assert_allclose(priv[18:26], hist, atol=0)
    np.testing.assert_allclose(priv[26:30], x[13:17] / float(p.rpm_max), rtol=1e-6)
    np.testing.assert_allclose(priv[30:36], dist / mg, rtol=1e-5)  # all zero: quiet config
    np.testing.assert_allclose(priv[36:48], np.asarray(p.as_vector()), rtol=1e-6)
    assert priv.shape == (48,) and hover.shape == ()
    # Velocity error against the moving target and position_error metric.
    assert float(s.metrics["position_error"]) == pytest.approx(np.linalg.norm(x[:3] - tp), rel=1e-5)


def test_observation_noise_statistics(hover_resets):
    """Actor noise σ: position 1e-3, rotation 1e-3, velocity 2e-3, ω 2e-3; critic's is clean."""
    noise = np.asarray(
        hover_resets.obs["state"][:, :18] - hover_resets.obs["privileged_state"][:, :18]
    )
    sigma = np.array([1e-3] * 12 + [2e-3] * 6)
    np.testing.assert_allclose(noise.std(0), sigma, rtol=0.03)  # n = 20k: se of σ ≈ 0.5 %
    np.testing.assert_allclose(noise.mean(0), 0.0, atol=4 * sigma.max() / math.sqrt(len(noise)))
    corr = np.corrcoef(noise.T)
    assert np.abs(corr - np.eye(18)).max() < 0.05


def test_reward_terms_and_curriculum(quiet_config):
    rc = RewardConfig(
        position=5.0,
        position_final=40.0,
        velocity=0.01,
        velocity_final=1.0,
        action=0.01,
        action_final=1.0,
        position_l1=0.3,
        orientation=5.0,
        angular_velocity=0.1,
        termination=7.0,
    )
    cfg = dataclasses.replace(quiet_config, reward=rc, init=InitConfig(at_target_prob=0.0))
    env = QuadrotorEnv(cfg)
    s = env.reset(jax.random.key(8))
    progress = 0.25
    s = s.replace(info={**s.info, "progress": jnp.float32(progress)})
    a = np.array([0.5, -0.1, 0.2, 0.0], np.float32)
    s = env.step(s, a)
    x = rigid_vector(s.data.rigid).astype(np.float64)
    hover = float(env.default_action[0])

    def lerp(lo, hi):
        return lo + (hi - lo) * progress

    want = {
        "position": -0.5 * lerp(5.0, 40.0) * x[0:3] @ x[0:3],
        "position_l1": -0.3 * np.sqrt(x[0:3] @ x[0:3]),
        "orientation": -0.5 * 5.0 * (1 - x[3] ** 2),
        "velocity": -0.5 * lerp(0.01, 1.0) * x[7:10] @ x[7:10],
        "angular_velocity": -0.5 * 0.1 * x[10:13] @ x[10:13],
        "action": -0.5 * lerp(0.01, 1.0) * np.sum((a - hover) ** 2),
        "alive": 2.0,
    }
    for k, v in want.items():
        assert float(s.metrics[f"reward/{k}"]) == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert s.done == 0
    assert float(s.reward) == pytest.approx(sum(want.values()), rel=1e-5)
    # The terminating step pays −termination instead.
    far = s.data.rigid.replace(pos=(jnp.float32(2.5), jnp.float32(0.0), jnp.float32(0.0)))
    s = env.step(s.replace(data=s.data.replace(rigid=far)), a)
    assert s.done == 1 and float(s.reward) == -7.0


def test_reset_does_not_reuse_the_stored_key():
    env = QuadrotorEnv()  # default observation noise
    s = env.reset(jax.random.key(0))
    noise = np.asarray(s.obs["state"][:18] - s.obs["privileged_state"][:18], np.float64)
    sigma = np.array([1e-3] * 12 + [2e-3] * 6)
    from_stored_key = sigma * np.asarray(jax.random.normal(s.info["rng"], (18,)), np.float64)
    assert not np.allclose(noise, from_stored_key, rtol=1e-3, atol=1e-7)
