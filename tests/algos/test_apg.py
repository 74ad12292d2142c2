"""Analytic policy gradients: config errors, gradients into the actor only, window-end resets and
bookkeeping, a learning test under the full eval protocol, and a run folder that exports."""

from __future__ import annotations

import dataclasses
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rich.console import Console

from algos import TrainConfig, ValidationConfig, get_preset, runner
from algos.apg import APGConfig, make_train
from algos.evaluate import eval_steps, rollout, summarize
from algos.run_folder import load_run, make_run_policy, read_metrics
from deploy.policy import forward, load_policy
from policies import NetworkConfig, make_policy
from sim import make_env
from sim.quadrotor import QuadrotorConfig


def small(**overrides) -> APGConfig:
    base = APGConfig(
        num_envs=16,
        horizon=8,
        total_timesteps=16 * 8 * 4,
        network=NetworkConfig(actor_hidden=(32, 32), critic_hidden=()),
    )
    return dataclasses.replace(base, **overrides)


@pytest.mark.parametrize(
    "cfg, match",
    [
        (APGConfig(horizon=0), "apg.horizon"),
        (APGConfig(num_envs=0), "apg.num_envs"),
        (APGConfig(learning_rate=0.0), "learning_rate"),
        (APGConfig(action_noise=-0.1), "action_noise"),
        (APGConfig(unroll=0), "apg.unroll"),
    ],
)
def test_bad_config_names_the_field(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg.validate()


def test_arm_tasks_are_refused():
    with pytest.raises(ValueError, match="quadrotor tasks only"):
        get_preset("arm-reach", "cpu", "apg")
    with pytest.raises(ValueError, match="differentiates through the simulator"):
        TrainConfig(task="arm-push", algo="apg").validate()


def test_update_moves_the_actor_only_with_finite_gradients():
    env = make_env("quadrotor-hover")
    trainer = make_train(small(), env, 500)
    ts = jax.jit(trainer.init)(jax.random.key(0))
    ts2, metrics = jax.jit(trainer.update)(ts)
    assert int(ts2.update) == 1 and float(metrics["skipped"]) == 0.0
    assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.any(a != b)), ts.params, ts2.params))
    assert any(moved)
    for name in ("critic", "log_std"):
        same = jax.tree.map(lambda a, b: bool(jnp.all(a == b)), ts.params[name], ts2.params[name])
        assert all(jax.tree.leaves(same)), name
    # the first update drew every env's initial state and advanced it by the horizon; an env
    # whose episode ended (terminated: no truncation in 8 steps) is marked for the next reset
    done = np.asarray(ts2.env_state.done) > 0
    steps = np.asarray(ts2.env_state.info["steps"])
    assert np.all(steps[~done] == 8) and np.all(steps[done] < 8)


def test_unrolled_window_gives_the_same_update():
    env = make_env("quadrotor-hover")
    ts = jax.jit(make_train(small(), env, 500).init)(jax.random.key(0))
    one, two = (jax.jit(make_train(small(unroll=u), env, 500).update)(ts)[0] for u in (1, 2))
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(
        one.params["actor"]["params"]["Dense_0"]["kernel"],
        ts.params["actor"]["params"]["Dense_0"]["kernel"],
    )


def test_ended_episodes_keep_their_statistics_and_are_reset_by_the_next_update():
    """A 0.3 m box: starts up to 0.5 m off the target terminate on their first steps. Those envs
    are marked `done` at the window's end (the logged episode statistics are theirs) and start
    fresh episodes in the next update; the others run on."""
    env = make_env("quadrotor-hover", QuadrotorConfig(termination_distance=0.3))
    trainer = make_train(small(horizon=4), env, 500)
    update = jax.jit(trainer.update)
    ts = jax.jit(trainer.init)(jax.random.key(1))
    assert np.all(np.asarray(ts.env_state.done) == 1)  # placeholders: the first update resets
    ts1, m = update(ts)
    ended = np.asarray(ts1.env_state.done) > 0
    steps1 = np.asarray(ts1.env_state.info["steps"])
    assert 0 < ended.sum() < 16 and np.all(steps1[~ended] == 4) and np.all(steps1[ended] < 4)
    assert float(m["episode/count"]) == ended.sum()
    assert float(m["episode/termination_rate"]) == 1.0
    assert 1.0 <= float(m["episode/length"]) <= 4.0
    length = np.asarray(ts1.env_state.info["episode_length"])
    assert np.all(length[ended] == 0) and np.all(length[~ended] == 4)
    pos1 = np.asarray(jnp.stack(ts1.env_state.data.rigid.pos, -1))
    assert np.all(np.abs(pos1[~ended]) <= 0.3)
    ts2, _ = update(ts1)
    # an env that ran on through the second window counts 8 steps, a reset one 4
    ran = np.asarray(ts2.env_state.done) == 0
    steps2 = np.asarray(ts2.env_state.info["steps"])
    assert np.all(steps2[ran & ~ended] == 8) and np.all(steps2[ran & ended] == 4)
    assert (ran & ended).any()
    pos2 = np.asarray(jnp.stack(ts2.env_state.data.rigid.pos, -1))
    assert not np.allclose(pos2[ran & ended], pos1[ran & ended])


@pytest.mark.slow
def test_apg_learns_to_hover_precisely():
    """The CPU preset's recipe under the run folder's stopping rule (validation on other episodes
    every 50 updates from update 300, stop at 96 %), then the eval protocol: seed 0's run folder
    stops at update 400–500 with 97.2–98.5 % eval, depending on the machine's float bits (an
    AVX-512 Zen 4 needed 500 updates: 80.4 % at update 400). An untrained policy has 0 %; the
    thresholds fail for a learner that does not learn to hold the target within 0.1 m."""
    cfg = get_preset("quadrotor-hover", "cpu", "apg")
    val = cfg.validation
    env = make_env(cfg.task, cfg.env, cfg.randomization)
    trainer = make_train(cfg.apg, env, cfg.env.episode_steps)
    update = jax.jit(trainer.update, donate_argnums=0)
    ts = jax.jit(trainer.init)(jax.random.key(0))
    steps, settle = eval_steps(cfg.eval, env.dt)

    @jax.jit
    def episodes(params, key):
        policy = make_policy(trainer.network, params, deterministic=True)
        return rollout(env, policy, key, val.episodes, steps)

    def success(seed: int) -> dict:
        return summarize(episodes(ts.params, jax.random.key(seed)), settle, cfg.eval.tolerance)

    for n in range(1, 1001):
        ts, metrics = update(ts)
        assert float(metrics["skipped"]) == 0.0
        if val.due(n) and success(val.seed)["success_rate"] >= val.stop_at:
            break
    assert n < 1000, "validation never reached the stopping rate in 1000 updates"
    assert cfg.eval.episodes == val.episodes
    result = success(cfg.eval.seed)
    assert result["success_rate"] >= 0.93 and result["termination_rate"] <= 0.02, (n, result)


def test_run_folder_resume_eval_and_export(tmp_path):
    cfg = get_preset("quadrotor-hover", "cpu", "apg")
    cfg = dataclasses.replace(
        cfg,
        apg=small(),
        validation=ValidationConfig(),
        checkpoint_every=2,
        eval=dataclasses.replace(cfg.eval, episodes=8),
    )
    run = tmp_path / "run"
    first = runner.train(cfg, run, stop_after=2, console=Console(file=io.StringIO()))
    assert (first.update, first.eval) == (2, None)
    result = runner.train(cfg, run, console=Console(file=io.StringIO()))  # resumes at update 2
    assert (result.update, result.total) == (4, 4) and result.eval["episodes"] == 8
    rows = read_metrics(run)
    assert [int(r["update"]) for r in rows] == [1, 2, 3, 4] and "grad_norm" in rows[0]
    loaded = load_run(run)
    dense = load_policy(run)
    obs = np.random.default_rng(0).normal(size=(5, dense.obs_size)).astype(np.float32)
    want, _ = make_run_policy("apg", loaded.network, loaded.params)(jnp.asarray(obs), None)
    np.testing.assert_allclose(forward(dense, obs), np.asarray(want), atol=1e-5)
