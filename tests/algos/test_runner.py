"""Training shell over a run folder: contents, resume, refusal of bad input (tiny CPU configs)."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import re
import shutil
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest
from rich.console import Console

from algos import TrainConfig, ValidationConfig, get_preset, runner
from algos.ppo import make_train
from algos.run_folder import (
    RunError,
    checkpoint_path,
    config_hash,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_run,
    make_env_and_network,
    read_metrics,
)

pytestmark = pytest.mark.xdist_group("runner")  # `finished_run` trains once (-n 2)

UPDATES = 24


def tiny_config(**overrides) -> TrainConfig:
    """24 updates of 64 envs × 32 steps, no validation unless asked; shared by every test so
    that compiles are reused."""
    cfg = get_preset("quadrotor-hover", "cpu", "ppo")
    net = dataclasses.replace(cfg.ppo.network, critic_hidden=(64, 64))
    ppo = dataclasses.replace(
        cfg.ppo, total_timesteps=UPDATES * 64 * 32, num_envs=64, unroll_length=32, network=net
    )
    cfg = dataclasses.replace(
        cfg,
        ppo=ppo,
        checkpoint_every=4,
        eval=dataclasses.replace(cfg.eval, episodes=8),
        validation=ValidationConfig(),
    )
    return dataclasses.replace(cfg, **overrides)


def tensorboard_scalars(folder) -> dict[tuple[str, int], float]:
    """{(tag, step): value} of the TensorBoard event files in `folder` (TFRecord framing: length,
    its CRC, the Event, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    out = {}
    for path in folder.glob("events.out.tfevents.*"):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                out[v.tag, event.step] = v.simple_value
    return out


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def files(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "run"
    return run, runner.train(tiny_config(), run, console=quiet())


def test_train_writes_the_run_folder(finished_run):
    run, result = finished_run
    assert result.update == result.total == UPDATES
    names = {p.name for p in run.iterdir()}
    assert {
        "config.json",
        "checkpoints",
        "metrics.csv",
        "tb",
        "learning_curve.png",
        "eval.json",
        "eval_trajectories.png",
        "run.log",
    } <= names
    assert [p.name for p in list_checkpoints(run)] == [
        f"ckpt_{u:08d}.msgpack" for u in (16, 20, 24)
    ]
    rows = read_metrics(run)
    assert [int(r["update"]) for r in rows] == list(range(1, UPDATES + 1))
    assert rows[-1]["env_steps"] == UPDATES * 2048 and "episode/return" in rows[0]
    scalars = tensorboard_scalars(run / "tb")
    for row in (rows[0], rows[-1]):  # every metric of the row, as one event at its env step
        logged = {k: v for k, v in row.items() if k not in ("update", "env_steps", "wall_time_s")}
        step = int(row["env_steps"])
        assert {k: scalars[k, step] for k in logged} == pytest.approx(logged)
    doc = json.loads((run / "eval.json").read_text())
    assert doc["update"] == UPDATES and doc["episodes"] == 8
    assert {k: doc[k] for k in result.eval} == result.eval
    assert set(result.eval) == {"success_rate", "pos_rmse_m", "termination_rate", "episodes"}
    log = (run / "run.log").read_text()
    assert "time to first update" in log and "compilation cache" in log
    clock = re.search(rf"clock: [\d.]+ s to the first update, then {UPDATES - 1} updates ", log)
    assert clock and "validations" in log and "checkpoints and plots" in log
    assert jax.config.jax_compilation_cache_dir


def test_finished_run_is_not_retrained(finished_run):
    run, result = finished_run
    before = files(run)
    again = runner.train(tiny_config(), run, console=quiet())
    assert again == result
    after = files(run)
    assert "is complete" in after.pop(next(k for k in after if k.name == "run.log")).decode()
    assert after == {k: v for k, v in before.items() if k.name != "run.log"}


def test_eval_is_deterministic_and_custom_counts_keep_eval_json(finished_run):
    run, result = finished_run
    eval_json = (run / "eval.json").read_bytes()
    assert runner.evaluate_run(run, console=quiet()) == result.eval
    small = runner.evaluate_run(run, episodes=3, console=quiet())
    assert small["episodes"] == 3
    assert (run / "eval.json").read_bytes() == eval_json
    with pytest.raises(RunError, match="episodes"):
        runner.evaluate_run(run, episodes=0, console=quiet())


def test_resume_continues_update_counter_without_duplicate_rows(tmp_path):
    run, cfg = tmp_path / "run", tiny_config()
    first = runner.train(cfg, run, stop_after=6, console=quiet())
    assert first.update == 6 and first.eval is None
    assert latest_checkpoint(run) == checkpoint_path(run, 6)
    # A kill after update 6's metrics row, before its checkpoint; and a half-written row.
    checkpoint_path(run, 6).unlink()
    with open(run / "metrics.csv", "a") as f:
        f.write("7,14336,1")
    console = quiet()
    result = runner.train(cfg, run, console=console)
    assert "resume from ckpt_00000004.msgpack" in console.file.getvalue()
    assert result.update == UPDATES and result.eval is not None
    assert [int(r["update"]) for r in read_metrics(run)] == list(range(1, UPDATES + 1))
    # The optimizer state was restored: Adam's step count covers all updates.
    trainer = make_train(cfg.ppo, make_env_and_network(cfg)[0], cfg.env.episode_steps)
    like = jax.eval_shape(trainer.init, jax.random.key(0))
    ckpt = load_checkpoint(latest_checkpoint(run), like.params, like.opt_state, config_hash(cfg))
    assert ckpt.update == UPDATES
    adam = ckpt.opt_state[1][0]
    assert int(adam.count) == UPDATES * cfg.ppo.update_epochs * cfg.ppo.num_minibatches


def test_validation_stop_ends_the_run_at_that_checkpoint(tmp_path):
    run = tmp_path / "run"
    val = ValidationConfig(every=4, start=6, episodes=8, stop_at=0.0)  # 0: stops at the first
    cfg = tiny_config(validation=val)
    console = quiet()
    result = runner.train(cfg, run, console=console)
    assert (result.update, result.total) == (6, UPDATES) and result.eval is not None
    assert latest_checkpoint(run) == checkpoint_path(run, 6)
    assert [int(r["update"]) for r in read_metrics(run, "validation.csv")] == [6]
    assert len(read_metrics(run)) == 6
    assert json.loads((run / "eval.json").read_text())["update"] == 6
    assert "validation success ≥ 0.0% after 6 updates" in console.file.getvalue()
    before = files(run)
    assert runner.train(cfg, run, console=quiet()) == result  # complete: not retrained
    assert {k: v for k, v in files(run).items() if k.name != "run.log"} == {
        k: v for k, v in before.items() if k.name != "run.log"
    }


def test_validation_below_stop_at_trains_on_and_resumes(tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(validation=ValidationConfig(every=8, start=8, episodes=8, stop_at=1.01))
    assert runner.train(cfg, run, stop_after=10, console=quiet()).update == 10
    for u in (10, 8):  # as if killed after update 8's validation, before its checkpoint
        checkpoint_path(run, u).unlink()
    console = quiet()
    result = runner.train(cfg, run, console=console)
    assert "resume from ckpt_00000004.msgpack" in console.file.getvalue()
    assert result.update == UPDATES
    rows = read_metrics(run, "validation.csv")
    assert [int(r["update"]) for r in rows] == [8, 16, 24]
    assert all(0.0 <= r["success_rate"] <= 1.0 and r["episodes"] == 8 for r in rows)


def test_budget_ending_below_the_best_validation_keeps_the_best_parameters(tmp_path, monkeypatch):
    """The selection rule alone: validation results are scripted (update 8: 50 %, 16: 90 %,
    24: 70 %), so the final checkpoint must carry update 16's parameters."""
    scripted = iter([0.5, 0.9, 0.7])

    def fake_validation(cfg, env, network):
        return lambda params: {
            "success_rate": next(scripted),
            "pos_rmse_m": 0.1,
            "termination_rate": 0.0,
            "episodes": 8,
        }

    monkeypatch.setattr(runner, "_make_validation", fake_validation)
    run = tmp_path / "run"
    val = ValidationConfig(every=8, start=8, episodes=8, stop_at=1.01)
    cfg = tiny_config(validation=val, checkpoint_every=2)
    console = quiet()
    assert runner.train(cfg, run, console=console).update == UPDATES
    assert "final policy: the parameters of update 16" in console.file.getvalue()
    assert [p.name for p in list_checkpoints(run)] == [
        f"ckpt_{u:08d}.msgpack" for u in (16, 20, 22, 24)
    ]
    like = jax.eval_shape(make_env_and_network(cfg)[1].init, jax.random.key(0))
    best, last = (load_checkpoint(checkpoint_path(run, u), like) for u in (16, UPDATES))
    assert last.update == UPDATES
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), best.params, last.params)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_tensorboard_writer_is_imported_without_torch(tmp_path):
    """tensorboardX imports torch when it can (~1 s of a CPU run's clock): the runner's import
    hides it, and torch still imports afterwards."""
    code = (
        "import sys; from algos.runner import _summary_writer; "
        f"w = _summary_writer({str(tmp_path)!r}, 1); w.close(); "
        "assert type(w).__name__ == 'SummaryWriter' and 'torch' not in sys.modules; "
        "import torch; assert torch.zeros(1).shape == (1,)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_validation_schedule():
    v = ValidationConfig(every=40, start=280)
    assert [u for u in range(1, 400) if v.due(u)] == [280, 320, 360]
    assert not any(ValidationConfig().due(u) for u in range(1, 100))
    with pytest.raises(ValueError, match="validation"):
        ValidationConfig(every=-1).validate()


def test_changed_config_is_refused_and_nothing_changes(finished_run):
    run, _ = finished_run
    before = files(run)
    cfg = tiny_config(seed=3)
    with pytest.raises(RunError, match=r"seed \(0 → 3\)") as err:
        runner.train(cfg, run, console=quiet())
    assert "\n" not in str(err.value) and "config.json" in str(err.value)
    assert files(run) == before


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_checkpoint_is_refused_and_nothing_changes(finished_run, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run)
    path = latest_checkpoint(run)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3] if damage == "truncate" else b"\x93" * 100)
    before = files(run)
    for call in (
        lambda: runner.train(tiny_config(), run, console=quiet()),
        lambda: runner.evaluate_run(run, console=quiet()),
        lambda: load_run(run),
    ):
        with pytest.raises(RunError, match=path.name) as err:
            call()
        assert "\n" not in str(err.value)
    assert files(run) == before


def test_bad_input_leaves_no_trace(tmp_path):
    with pytest.raises(RunError, match="unknown task"):
        runner.train(tiny_config(task="quadrotor-fly"), tmp_path / "a", console=quiet())
    assert not (tmp_path / "a").exists()
    for bad in (tiny_config(checkpoint_every=0), tiny_config(seed=1.5)):
        with pytest.raises(RunError):
            runner.train(bad, tmp_path / "a", console=quiet())
    assert not (tmp_path / "a").exists()
    with pytest.raises(RunError, match="does not exist"):
        runner.evaluate_run(tmp_path / "missing", console=quiet())
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not empty"):
        runner.train(tiny_config(), other, console=quiet())
    assert files(other) == {other.joinpath("notes.txt").relative_to(other): b"mine"}
