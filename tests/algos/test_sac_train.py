"""SAC trainer: determinism (STYLE.md §5), what one update stores and learns, seed-vmapping.

On the 2-D point mass of the PPO tests (a quadrotor compile takes ~30 s); the quadrotor runs in
test_sac_runner.py and test_sac_learning.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.sac import SACConfig, make_train
from policies import NetworkConfig
from tests.algos.test_ppo_determinism import PointMass, bitwise_equal, leaves

TINY = SACConfig(
    total_timesteps=4 * 16 * 8,
    num_envs=16,
    unroll_length=8,
    utd_ratio=1 / 32,  # 4 gradient steps per update
    learning_starts=2 * 16 * 8,  # gradient steps from the second update on
    buffer_size=3 * 16 * 8,  # wraps around in the fourth update
    batch_size=32,
    network=NetworkConfig(actor_hidden=(16, 16), critic_hidden=(16, 16)),
)
EPISODE = 5


@pytest.fixture(scope="module")
def trainer():
    return make_train(TINY, PointMass(), EPISODE)


@pytest.fixture(scope="module")
def run_seed0(trainer):
    return jax.jit(trainer.train)(jax.random.key(0))


def test_same_seed_bitwise_equal_different_seed_differs(trainer, run_seed0):
    ts, metrics = run_seed0
    ts2, metrics2 = jax.jit(trainer.train)(jax.random.key(0))
    assert bitwise_equal(ts.params, ts2.params) and bitwise_equal(ts.opt_state, ts2.opt_state)
    assert bitwise_equal(ts.replay, ts2.replay) and bitwise_equal(metrics, metrics2)
    ts1, _ = jax.jit(trainer.train)(jax.random.key(1))
    assert not np.array_equal(ts.params["log_std"], ts1.params["log_std"])
    assert not bitwise_equal(ts.params["critic"], ts1.params["critic"])


def test_training_outputs(run_seed0):
    ts, metrics = run_seed0
    assert int(ts.update) == TINY.num_updates == 4
    assert TINY.grad_steps == 4 and all(v.shape == (4,) for v in metrics.values())
    assert all(np.all(np.isfinite(v)) for v in leaves(metrics))
    np.testing.assert_allclose(metrics["progress"], [0.0, 0.25, 0.5, 0.75])
    # The buffer filled to capacity (4 × 128 transitions into 384 slots) and wrapped around.
    np.testing.assert_array_equal(metrics["replay_size"], [128, 256, 384, 384])
    assert int(ts.replay.size) == 384 and int(ts.replay.position) == 128
    # No gradient step before learning_starts transitions, then some in every update.
    assert float(metrics["loss/critic"][0]) == 0.0 and np.all(metrics["loss/critic"][1:] > 0)
    np.testing.assert_allclose(metrics["alpha"][1], TINY.init_alpha, rtol=0.01)  # mean over steps
    assert float(ts.params["obs_norm"].count) == TINY.num_envs * (1 + 4 * TINY.unroll_length)


def test_first_update_only_collects(trainer):
    ts0 = jax.jit(trainer.init)(jax.random.key(0))
    ts1, _ = jax.jit(trainer.update)(ts0)
    for name in ("actor", "log_std", "critic", "target_critic", "log_alpha"):
        assert bitwise_equal(ts0.params[name], ts1.params[name]), name
    ts2, _ = jax.jit(trainer.update)(ts1)
    for name in ("actor", "log_std", "critic", "target_critic", "log_alpha"):
        assert not bitwise_equal(ts1.params[name], ts2.params[name]), name
    # The target moved by Polyak steps only: much closer to its old value than the critic did.
    old, new, tgt = (
        np.concatenate([np.ravel(x) for x in leaves(t)])
        for t in (ts1.params["critic"], ts2.params["critic"], ts2.params["target_critic"])
    )
    assert np.abs(tgt - old).max() < 0.1 * np.abs(new - old).max()


def test_stored_transitions_flag_time_outs_not_terminations(trainer):
    """Episodes of 5 steps and 8-step rollouts: every env times out once in the first update
    (the point mass cannot leave |x| ≤ 2 that fast), so 16 of 128 transitions are masked, none
    terminal; rewards are the env's × reward_scale; next_obs follows obs within an episode."""
    ts, _ = jax.jit(trainer.update)(jax.jit(trainer.init)(jax.random.key(3)))
    data = jax.tree.map(lambda x: np.asarray(x[:128]), ts.replay.data)
    assert data["mask"].sum() == 128 - 16 and data["done"].sum() == 0
    step = data["obs"].reshape(8, 16, 2)  # [T, B] order
    nxt = data["next_obs"].reshape(8, 16, 2)
    mask = data["mask"].reshape(8, 16)
    np.testing.assert_array_equal(mask[4], 0.0)  # step 5 of each episode
    np.testing.assert_array_equal(step[1:4], nxt[0:3])
    r = -np.sum(data["next_obs"] ** 2, axis=-1) * TINY.reward_scale
    np.testing.assert_allclose(data["reward"][data["mask"] > 0], r[data["mask"] > 0], rtol=1e-5)
    assert np.all(np.abs(data["action"]) < 1.0)


def test_train_vmaps_over_seeds(trainer, run_seed0):
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
    ts, metrics = jax.jit(jax.vmap(trainer.train))(keys)
    assert all(v.shape == (2, TINY.num_updates) for v in metrics.values())
    row0 = jax.tree.map(lambda v: v[0], ts.params)
    for x, y in zip(leaves(run_seed0[0].params), leaves(row0), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("utd_ratio", 0.3, "whole number"),
        ("buffer_size", 100, "buffer_size"),
        ("learning_starts", 8, "learning_starts"),
        ("gamma", 1.5, "gamma"),
        ("num_envs", 0, "num_envs"),
    ],
)
def test_bad_config_is_one_clear_error(field, value, match):
    import dataclasses

    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **{field: value}).validate()
