"""Smoke test of benchmarks/kernel_profile.py at a tiny size: the JSON's shape (the CPU trace has
no device kernels, so only the wall clock is filled in)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
kernel_profile = pytest.importorskip("kernel_profile")


def test_tiny_profile_reports_every_rollout(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    argv = ["--batch-size", "32", "--steps", "2", "--top", "3", "--rollouts", "actor_rollout"]
    argv += ["--out", str(out)]
    report = kernel_profile.main(argv)
    assert json.loads(capsys.readouterr().out) == report == json.loads(out.read_text())
    assert set(report["results"]) == {"actor_rollout", "actor_rollout_batch_last"}
    for r in report["results"].values():
        assert r["steps_per_s"] > 0 and r["wall_ms_per_step"] > 0
        assert len(r["kernels"]) <= 3
        assert r["device_ms_per_step"] == pytest.approx(
            sum(k["ms_per_step"] for k in r["kernels"]) + r["other_ms_per_step"], abs=1e-3
        )
