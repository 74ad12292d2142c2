"""`hoverfly train|eval|render` on an arm task and residual runs through the run folder."""

from __future__ import annotations

import dataclasses
import json

import imageio.v3 as iio
import jax
import numpy as np
import pytest

from algos import TrainConfig, get_preset
from algos.residual import ResidualConfig, ResidualWrapper
from algos.run_folder import make_train_env, read_config, run_dict
from hoverfly import cli
from sim.manipulator import Perturbation
from tests.test_cli import hoverfly, one_line_error

# 2 updates of 16 envs × 8 steps, 10-step episodes, 4 eval episodes of 0.2 s (10 steps)
TINY_ARM = (
    "--ppo.total-timesteps 256 --ppo.num-envs 16 --ppo.unroll-length 8 --ppo.num-minibatches 2 "
    "--ppo.network.actor-hidden 16 --ppo.network.critic-hidden 16 --arm.episode-steps 10 "
    "--eval.episodes 4 --eval.seconds 0.2 --eval.settle-seconds 0.1"
).split()


@pytest.fixture(scope="module")
def arm_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("arm") / "run"
    proc = hoverfly("train", "arm-reach", "--out", run, *TINY_ARM)
    assert proc.returncode == 0, proc.stderr
    return run


def test_arm_run_folder_holds_only_the_arm_sections(arm_run):
    doc = json.loads((arm_run / "config.json").read_text())
    assert {"arm", "arm_randomization", "ppo"} <= set(doc["config"])
    assert not {"env", "randomization", "residual", "sac"} & set(doc["config"])
    cfg = read_config(arm_run)
    assert cfg.arm.action_space == "cartesian" and cfg.arm.episode_steps == 10
    ev = json.loads((arm_run / "eval.json").read_text())
    assert ev["episodes"] == 4 and 0.0 <= ev["success_rate"] <= 1.0
    assert ev["pos_rmse_m"] > 0.0  # tool-to-goal distance of an untrained policy


def test_eval_json_and_render_video(arm_run, tmp_path):
    proc = hoverfly("eval", arm_run, "--json")  # the run's eval program: a compilation cache hit
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["episodes"] == 4  # one JSON object: mjx's notices not on stdout
    video = tmp_path / "reach.mp4"
    args = ["render", arm_run, "--out", video, "--camera", "front", "wrist"]
    proc = hoverfly(*args, "--height", "64", "--width", "96", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    frames = iio.imread(video, plugin="FFMPEG")
    assert frames.shape == (report["frames"], 64, 192, 3) and report["frames"] == 11
    assert frames.std() > 5  # an image, not a blank frame
    assert not list(tmp_path.glob(".*"))  # no temp file left behind


def test_render_refuses_a_quadrotor_run(hover_run, tmp_path, capsys):
    assert cli.main(["render", str(hover_run), "--out", str(tmp_path / "v.mp4")]) == 2
    one_line_error(capsys.readouterr().err, "rendering needs an arm run")
    assert not (tmp_path / "v.mp4").exists()


def test_residual_sections_and_bases():
    plain = get_preset("quadrotor-hover")
    assert "residual" not in run_dict(plain)
    cfg = TrainConfig(residual=ResidualConfig(base="controller"))
    env = make_train_env(cfg)
    n = make_train_env(plain).observation_size["state"][0]
    assert env.observation_size["state"] == (n + 4,)  # the base action is appended
    assert run_dict(cfg)["residual"]["base"] == "controller"
    s = jax.jit(env.reset)(jax.random.key(0))
    assert np.all(np.abs(s.info["base_action"]) <= 1.0)
    with pytest.raises(ValueError, match="base_run is needed"):
        ResidualConfig(base="run").validate()
    pick = get_preset("arm-pick-place")
    perturbed = dataclasses.replace(
        pick,
        residual=ResidualConfig(base="scripted"),
        arm_perturbation=dataclasses.replace(pick.arm_perturbation, episode_prob=1.0),
    )
    env = make_train_env(perturbed)
    assert isinstance(env, ResidualWrapper) and isinstance(env.env, Perturbation)
    assert not isinstance(make_train_env(pick), Perturbation)  # off by default
    with pytest.raises(ValueError, match="cartesian"):
        make_train_env(
            dataclasses.replace(
                perturbed, arm=dataclasses.replace(pick.arm, action_space="joint_delta")
            )
        )
    with pytest.raises(ValueError, match="flies quadrotors"):
        make_train_env(TrainConfig(task="arm-reach", residual=ResidualConfig(base="controller")))


def test_residual_base_on_the_wrong_task_is_a_one_line_error(tmp_path):
    args = ["--out", tmp_path / "r", "--residual.base", "scripted"]
    proc = hoverfly("train", "quadrotor-hover", *args)
    assert proc.returncode == 2
    one_line_error(proc.stderr, "drives the arm")
