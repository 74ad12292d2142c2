"""`hoverfly vla collect|sft` and `hoverfly export` of a VLA run: demonstrations, behaviour
cloning and ONNX through the command, and their bad-input errors."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import hoverfly, one_line_error
from vla.dataset import LeRobotDataset

pytestmark = pytest.mark.xdist_group("vla_cli")  # the module's collected dataset, once (-n 2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("vla") / "demo"
    proc = hoverfly(
        "vla", "collect", "--out", out, "--episodes", "2", "--image-size", "32", "32",
        "--batch-size", "3", "--max-steps", "200", "--hold-steps", "3", "--json",
        "--cache-dir", "None",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_collect_writes_a_dataset(dataset):
    out, report = dataset
    data = LeRobotDataset(out)
    assert report == {"dataset": str(out), "episodes": 2, "frames": len(data)}
    assert all(e.metadata["success"] for e in data.episodes)
    sample = data[0]
    assert sample["observation.images.front"].shape == (32, 32, 3)
    assert "cube" in sample["task"]


def test_collect_refuses_bad_input(tmp_path):
    proc = hoverfly("vla", "collect", "--out", tmp_path / "d", "--task", "arm-reach")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "picks and places")
    proc = hoverfly("vla", "collect", "--out", tmp_path / "d", "--colours", "purple")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "purple")
    assert not (tmp_path / "d").exists()


def test_sft_trains_and_resumes(dataset, tmp_path):
    data, _ = dataset
    run = tmp_path / "sft"
    args = ("vla", "sft", "--data", data, "--out", run, "--preset", "test", "--batch-size", "4",
            "--warmup-steps", "1", "--eval-episodes", "0", "--json")  # fmt: skip
    proc = hoverfly(*args, "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checkpoint"].endswith("step_00000003")
    proc = hoverfly(*args, "--steps", "5")  # resumes at step 3
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checkpoint"].endswith("step_00000005")
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows][-1] == 5
    proc = hoverfly("export", run, "--out", tmp_path / "onnx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["checkpoint"].endswith("step_00000005") and report["max_abs_error"] < 1e-4
    assert {"prefix.onnx", "denoise_step.onnx"} <= {p.name for p in (tmp_path / "onnx").iterdir()}
    proc = hoverfly("export", run, "--out", tmp_path / "onnx8", "--precision", "int8")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "fp32 only")


def test_sft_refuses_bad_input(dataset, tmp_path):
    proc = hoverfly("vla", "sft", "--data", tmp_path / "missing", "--out", tmp_path / "r")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "missing")
    data, _ = dataset
    proc = hoverfly("vla", "sft", "--data", data, "--out", tmp_path / "r", "--lr", "-1")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "lr")


def test_rl_refuses_bad_input(tmp_path):
    proc = hoverfly("vla", "rl", tmp_path / "missing", "--out", tmp_path / "r")
    assert proc.returncode == 2
    one_line_error(proc.stderr, "missing")
    proc = hoverfly("vla", "rl", tmp_path / "x", "--out", tmp_path / "r", "--algo", "grpo",
                    "--num-envs", "6", "--group-size", "4")  # fmt: skip
    assert proc.returncode == 2
    one_line_error(proc.stderr, "group_size")
    assert not (tmp_path / "r").exists()
