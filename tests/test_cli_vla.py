"""`hoverfly vla collect|sft` and `hoverfly export` of a VLA run: demonstrations, behaviour
cloning and ONNX through the command, and their bad-input errors. The first training runs in a
subprocess, as a user runs it; the rest call `hoverfly.cli.main` in the test's process (a
subprocess spends ~7 s importing, and the collect reuses the demo collection's compiled
rollout)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from hoverfly import cli
from tests.test_cli import hoverfly, one_line_error
from vla.dataset import LeRobotDataset

pytestmark = [
    pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning"),  # ffmpeg, EGL probe
    pytest.mark.xdist_group("vla_demo"),  # reuses the demo collection's compiled rollout (-n 2)
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """`hoverfly vla collect` in this process, with the batch size and step limit of the
    session's `demo_dataset`: the rollout compiled for either serves both."""
    out = tmp_path_factory.mktemp("vla") / "demo"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(
            ["vla", "collect", "--out", str(out), "--episodes", "2", "--image-size", "32", "32",
             "--batch-size", "4", "--max-steps", "200", "--hold-steps", "3", "--json"]
        )  # fmt: skip
    assert code == 0
    return out, json.loads(stdout.getvalue())


def test_collect_writes_a_dataset(dataset):
    out, report = dataset
    data = LeRobotDataset(out)
    assert report == {"dataset": str(out), "episodes": 2, "frames": len(data)}
    assert all(e.metadata["success"] for e in data.episodes)
    sample = data[0]
    assert sample["observation.images.front"].shape == (32, 32, 3)
    assert "cube" in sample["task"]


def _main(capsys, *args) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `hoverfly ARGS` run in this process."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, match: str, *args) -> None:
    code, _, err = _main(capsys, *args)
    assert code == 2
    one_line_error(err, match)


def test_collect_refuses_bad_input(tmp_path, capsys):
    _refused(capsys, "picks and places", "vla", "collect", "--out", tmp_path / "d", "--task",
             "arm-reach")  # fmt: skip
    _refused(capsys, "purple", "vla", "collect", "--out", tmp_path / "d", "--colours", "purple")
    assert not (tmp_path / "d").exists()


def test_sft_trains_and_resumes(dataset, tmp_path, capsys):
    data, _ = dataset
    run = tmp_path / "sft"
    args = ("vla", "sft", "--data", data, "--out", run, "--preset", "test", "--batch-size", "4",
            "--warmup-steps", "1", "--eval-episodes", "0", "--json")  # fmt: skip
    proc = hoverfly(*args, "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checkpoint"].endswith("step_00000003")
    code, out, err = _main(capsys, *args, "--steps", "5")  # resumes at step 3
    assert code == 0, err
    assert json.loads(out)["checkpoint"].endswith("step_00000005")
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows][-1] == 5
    code, out, err = _main(capsys, "export", run, "--out", tmp_path / "onnx", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["checkpoint"].endswith("step_00000005") and report["max_abs_error"] < 1e-4
    assert {"prefix.onnx", "denoise_step.onnx"} <= {p.name for p in (tmp_path / "onnx").iterdir()}
    _refused(capsys, "fp32 only", "export", run, "--out", tmp_path / "onnx8", "--precision", "int8")


def test_sft_refuses_bad_input(dataset, tmp_path, capsys):
    missing = tmp_path / "missing"
    _refused(capsys, "missing", "vla", "sft", "--data", missing, "--out", tmp_path / "r")
    data, _ = dataset
    _refused(capsys, "lr", "vla", "sft", "--data", data, "--out", tmp_path / "r", "--lr", "-1")


def test_rl_refuses_bad_input(tmp_path, capsys):
    _refused(capsys, "missing", "vla", "rl", tmp_path / "missing", "--out", tmp_path / "r")
    _refused(capsys, "group_size", "vla", "rl", tmp_path / "x", "--out", tmp_path / "r", "--algo",
             "grpo", "--num-envs", "6", "--group-size", "4")  # fmt: skip
    assert not (tmp_path / "r").exists()
