"""SAC through the run folder: checkpoints, resume, metrics, eval; PPO run folders unchanged."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from rich.console import Console

from algos import get_preset, runner
from algos.run_folder import (
    CONFIG,
    RunError,
    config_diff,
    config_hash,
    list_checkpoints,
    load_run,
    make_run_policy,
    read_config,
    read_metrics,
)
from deploy.policy import load_policy
from policies import NetworkConfig
from policies.sac import SACNetworks

UPDATES = 6
HOVER_RUN = Path(__file__).parents[1] / "data" / "hover_run"


def tiny_sac(**overrides):
    cfg = get_preset("quadrotor-hover", "cpu", "sac")
    sac = dataclasses.replace(
        cfg.sac,
        total_timesteps=UPDATES * 16 * 16,
        num_envs=16,
        unroll_length=16,
        utd_ratio=1 / 64,
        learning_starts=512,
        buffer_size=2048,
        batch_size=64,
        network=NetworkConfig(actor_hidden=(32, 32), critic_hidden=(32, 32)),
    )
    eval_cfg = dataclasses.replace(cfg.eval, episodes=4)
    return dataclasses.replace(cfg, sac=sac, checkpoint_every=2, eval=eval_cfg, **overrides)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_sac_run_folder_resume_and_eval(tmp_path):
    cfg, run = tiny_sac(), tmp_path / "run"
    first = runner.train(cfg, run, stop_after=3, console=quiet())
    assert (first.update, first.total, first.eval) == (3, UPDATES, None)
    assert [p.name for p in list_checkpoints(run)] == [
        "ckpt_00000002.msgpack",
        "ckpt_00000003.msgpack",
    ]
    doc = json.loads((run / CONFIG).read_text())
    assert doc["config"]["algo"] == "sac" and "sac" in doc["config"] and "ppo" not in doc["config"]
    assert config_diff(read_config(run), cfg) == [] and read_config(run).sac == cfg.sac
    done = runner.train(cfg, run, console=quiet())
    assert done.update == done.total == UPDATES and 0.0 <= done.eval["success_rate"] <= 1.0
    rows = read_metrics(run)
    assert [int(r["update"]) for r in rows] == list(range(1, UPDATES + 1))
    assert rows[-1]["env_steps"] == UPDATES * 256 and "loss/critic" in rows[0]
    # After the resume the (not checkpointed) buffer refills before gradient steps resume.
    assert [r["replay_size"] for r in rows] == [256, 512, 768, 256, 512, 768]
    assert rows[3]["loss/critic"] == 0 and rows[4]["loss/critic"] > 0
    for name in ("learning_curve.png", "eval.json", "eval_trajectories.png", "run.log"):
        assert (run / name).is_file(), name
    assert "replay refills" in (run / "run.log").read_text()

    loaded = load_run(run)
    assert isinstance(loaded.network, SACNetworks) and loaded.update == UPDATES
    # The deployable part has the PPO actor's layout: "actor" MLP, "obs_norm".
    dense = loaded.params["actor"]["params"]
    assert [dense[f"Dense_{i}"]["kernel"].shape for i in range(3)] == [(50, 32), (32, 32), (32, 4)]
    obs = jax.random.normal(jax.random.key(0), (5, 50))
    action, _ = make_run_policy("sac", loaded.network, loaded.params)(obs, None)
    mean, _ = loaded.network.actor(loaded.params, obs)
    np.testing.assert_allclose(action, np.tanh(mean), rtol=1e-6)
    assert runner.evaluate_run(run, cache_dir=None, console=quiet()) == done.eval
    with pytest.raises(RunError, match="sac runs is not supported"):  # deploy/ refuses, for now
        load_policy(run)


def test_ppo_run_folder_and_hash_are_unchanged():
    """config.json of a PPO run has no "sac" section, and the shipped run still loads."""
    cfg = read_config(HOVER_RUN)
    doc = json.loads((HOVER_RUN / CONFIG).read_text())
    assert cfg.algo == "ppo" and "sac" not in doc["config"]
    assert config_hash(cfg) == doc["config_hash"]
    assert config_hash(dataclasses.replace(cfg, sac=tiny_sac().sac)) == doc["config_hash"]
    assert load_run(HOVER_RUN).params["actor"]
