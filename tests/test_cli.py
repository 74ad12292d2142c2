"""The `hoverfly` command: argument wiring, subprocess runs, one-line errors, kill and resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from algos import PRESETS, get_preset
from algos.run_folder import RunError, latest_checkpoint, read_metrics
from hoverfly import cli

UPDATES = 24
TINY = (
    f"--algo ppo --ppo.total-timesteps {UPDATES * 64 * 32} --ppo.num-envs 64 "
    "--ppo.unroll-length 32 --ppo.network.critic-hidden 64 64 --checkpoint-every 4 "
    "--eval.episodes 8 --validation.every 0"
).split()


def hoverfly(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hoverfly", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def one_line_error(stderr: str, match: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("hoverfly: error:") and match in lines[-1], stderr
    assert "Traceback" not in stderr


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    """A finished tiny run, trained through the command in a subprocess."""
    run = tmp_path_factory.mktemp("cli") / "run"
    proc = hoverfly("train", "quadrotor-hover", "--out", run, *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "success" in proc.stdout and "time to first update" in proc.stderr
    return run


def test_train_subprocess_fills_the_run_folder(cli_run):
    for name in (
        "config.json",
        "metrics.csv",
        "eval.json",
        "learning_curve.png",
        "eval_trajectories.png",
        "run.log",
        "tb",
    ):
        assert (cli_run / name).exists(), name
    assert latest_checkpoint(cli_run).name == f"ckpt_{UPDATES:08d}.msgpack"


def test_eval_json_prints_exactly_one_object(cli_run):
    proc = hoverfly("eval", cli_run, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"success_rate", "pos_rmse_m", "termination_rate", "episodes"}
    assert doc["episodes"] == 8
    stored = json.loads((cli_run / "eval.json").read_text())
    assert {k: stored[k] for k in doc} == doc
    assert (cli_run / "eval_trajectories.png").stat().st_size > 0


def test_eval_human_readable(cli_run, capsys):
    assert cli.main(["eval", str(cli_run), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "success" in out and "RMSE" in out and "termination" in out and "3 episodes" in out


def test_overrides_build_the_train_config_on_the_preset():
    cmd = cli.parse(
        [
            "train",
            "quadrotor-track",
            "--out",
            "r",
            "--seed",
            "3",
            "--algo",
            "ppo",
            "--ppo.total-timesteps",
            "1000",
            "--env.reward.alive",
            "1.5",
        ]
    )
    assert isinstance(cmd, cli.Train) and cmd.task == cmd.config.task == "quadrotor-track"
    assert cmd.config.seed == 3 and cmd.config.ppo.total_timesteps == 1000
    assert cmd.config.env.reward.alive == 1.5
    assert cmd.config.ppo.num_envs == PRESETS["cpu"].ppo.num_envs
    gpu = cli.parse(["train", "quadrotor-hover", "--preset", "gpu", "--out", "r"])
    assert gpu.config == get_preset("quadrotor-hover", "gpu") and gpu.preset == "gpu"
    assert gpu.config.algo == "apg"
    ev = cli.parse(["eval", "r", "--episodes", "5", "--json"])
    assert isinstance(ev, cli.Eval) and ev.episodes == 5 and ev.json
    with pytest.raises(SystemExit):  # the task is the positional argument only
        cli.parse(["train", "quadrotor-hover", "--out", "r", "--task", "quadrotor-track"])


def test_algo_sac_takes_the_sac_preset_and_its_options():
    cmd = cli.parse(
        ["train", "quadrotor-hover", "--algo", "sac", "--out", "r", "--sac.num-envs", "8"]
    )
    want = get_preset("quadrotor-hover", "cpu", "sac")
    assert cmd.config.algo == "sac" and cmd.config.sac.num_envs == 8
    assert cmd.config.sac.utd_ratio == want.sac.utd_ratio and cmd.config.env == want.env
    gpu = cli.parse(["train", "quadrotor-hover", "--preset", "gpu", "--algo", "sac", "--out", "r"])
    assert gpu.config == get_preset("quadrotor-hover", "gpu", "sac")
    with pytest.raises(SystemExit):
        cli.parse(["train", "quadrotor-hover", "--algo", "td3", "--out", "r"])


def test_default_quadrotor_run_is_apg_and_evaluates(tmp_path):
    """The README main job's path (default learner, run folder, eval --json) on a tiny budget."""
    run = tmp_path / "run"
    tiny = ["--apg.total-timesteps", "6400", "--validation.every", "0", "--eval.episodes", "8"]
    proc = hoverfly("train", "quadrotor-hover", "--out", run, *tiny)
    assert proc.returncode == 0, proc.stderr
    assert "quadrotor-hover · apg · 2 updates × 3,200 env steps" in proc.stderr
    doc = json.loads((run / "config.json").read_text())
    assert doc["config"]["algo"] == "apg" and "ppo" not in doc["config"]
    proc = hoverfly("eval", run, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["episodes"] == 8


def test_default_learner_per_family_and_options_of_an_unused_section_are_refused():
    hover = cli.parse(["train", "quadrotor-hover", "--out", "r", "--apg.horizon", "50"])
    assert hover.config.algo == "apg" and hover.config.apg.horizon == 50
    assert hover.config.validation == get_preset("quadrotor-hover").validation
    assert cli.parse(["train", "arm-reach", "--out", "r"]).config.algo == "ppo"
    with pytest.raises(RunError, match=r"--ppo\.\* are ignored by a run of quadrotor-hover"):
        cli.parse(["train", "quadrotor-hover", "--out", "r", "--ppo.num-envs", "8"])
    with pytest.raises(RunError, match=r"--env\.\* are ignored by a run of arm-reach"):
        cli.parse(["train", "arm-reach", "--out", "r", "--env.substeps", "2"])
    with pytest.raises(RunError, match="apg has no preset for arm-reach"):
        cli.parse(["train", "arm-reach", "--out", "r", "--algo", "apg"])


def test_unknown_task_subprocess(tmp_path):
    proc = hoverfly("train", "quadrotor-fly", "--out", tmp_path / "run")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "unknown task 'quadrotor-fly'")
    assert not (tmp_path / "run").exists()


def test_missing_run_folder(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path / "nope")]) == 2
    one_line_error(capsys.readouterr().err, "does not exist")


def test_malformed_config_subprocess(cli_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(cli_run, run)
    (run / "config.json").write_text('{"config": {"ppo": {"num_envs": "many"}}, "config_hash": 1}')
    before = files(run)
    proc = hoverfly("eval", run, "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    one_line_error(proc.stderr, "config.ppo.num_envs")
    assert files(run) == before


@pytest.mark.parametrize("damage", ["truncated", "config"])
def test_bad_checkpoint_or_config_mismatch(cli_run, tmp_path, capsys, damage):
    run = tmp_path / "run"
    shutil.copytree(cli_run, run)
    args = ["train", "quadrotor-hover", "--out", str(run), *TINY]
    if damage == "truncated":
        ckpt = latest_checkpoint(run)
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
        match = ckpt.name
    else:
        args += ["--seed", "5", "--ppo.num-envs", "128"]
        match = "ppo.num_envs (64 → 128), seed (0 → 5)"
    before = files(run)
    assert cli.main(args) == 2
    one_line_error(capsys.readouterr().err, match)
    if damage == "truncated":
        assert cli.main(["eval", str(run)]) == 2
        one_line_error(capsys.readouterr().err, match)
    assert files(run) == before


@pytest.mark.slow
def test_sigkill_mid_run_then_same_command_resumes(tmp_path):
    run = tmp_path / "run"
    command = ["train", "quadrotor-hover", "--out", str(run), *TINY, "--checkpoint-every", "2"]
    args = [sys.executable, "-m", "hoverfly", *command]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # kill once update 5 is logged: past checkpoint 4, usually before checkpoint 6
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if len(read_metrics(run)) >= 5:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "training ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = int(latest_checkpoint(run).name[5:13])
    assert 4 <= killed_at < UPDATES and not (run / "eval.json").exists()
    assert len(read_metrics(run)) >= killed_at
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"resume from ckpt_{killed_at:08d}.msgpack" in done.stderr
    assert [int(r["update"]) for r in read_metrics(run)] == list(range(1, UPDATES + 1))
    assert json.loads((run / "eval.json").read_text())["update"] == UPDATES
    assert not list(run.rglob(".*.tmp"))
