"""Smoke test of benchmarks/pallas_actor.py on the CPU (Pallas' interpreter): the JSON's shape and
the parity it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
pallas_actor = pytest.importorskip("pallas_actor")


def test_interpreted_kernel_matches_xla(tmp_path, capsys):
    out = tmp_path / "pallas_actor.json"
    argv = ["--batch-sizes", "256", "--block-sizes", "64", "--programs", "0", "2"]
    argv += ["--num-stages", "1", "--fast-tanh", "False", "--splits", "0", "18", "--calls", "1"]
    report = pallas_actor.main([*argv, "--interpret", "--out", str(out)])
    assert json.loads(capsys.readouterr().out) == report == json.loads(out.read_text())
    res = report["results"]["256"]
    names = {f"block64_programs{p}_stages1_warps4{s}" for p in (0, 2) for s in ("", "_split18")}
    assert set(res["pallas"]) == names and res["best"] in names
    for variant in res["pallas"].values():
        assert variant["max_abs_diff_vs_xla"] < 1e-5
    assert 0.05 < res["clipped_share"] < 0.95
    assert variant["steps_per_s"] > 0 and res["xla"]["steps_per_s"] > 0
