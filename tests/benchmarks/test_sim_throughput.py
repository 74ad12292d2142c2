"""Smoke test of benchmarks/sim_throughput.py at tiny sizes: the JSON's shape, not its timings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("sim_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_tiny_run_reports_positive_rates(bench, tmp_path, capsys):
    out = tmp_path / "throughput.json"
    argv = [
        "--batch-sizes",
        "64",
        "--dynamics-steps",
        "10",
        "--env-steps",
        "10",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--peer-batch-sizes",
        "64",
        "--peer-steps",
        "10",
        "--peer-threads",
        "1",
        "--batch-axes",  # batch-last rollouts: tests/benchmarks/test_kernel_profile.py
        "0",
        "--out",
        str(out),
    ]
    report = bench.main(argv)

    assert json.loads(capsys.readouterr().out) == report == json.loads(out.read_text())
    for key in (
        "backend",
        "device",
        "jax_version",
        "cpu_count",
        "dtype",
        "config",
        "ours",
        "peer",
        "ratios",
        "notes",
    ):
        assert key in report
    assert report["dtype"] == "float32"
    for name in ("dynamics", "env", "policy_rollout", "actor_rollout"):
        result = report["ours"][name]["results"]["64"]
        assert result["steps_per_s"] > 0, result
        assert result["env_steps_per_call"] == 64 * 10
        assert report["ours"][name]["best"]["batch_size"] == 64
        assert report["ours"][name]["includes"]
    assert report["ours"]["dynamics"]["results"]["64"]["finite_fraction"] == 1.0
    assert not any(name.endswith("_batch_last") for name in report["ours"])

    peer = report["peer"]
    if "skipped" in peer:  # l2f is optional
        assert report["ratios"] == {}
        return
    for workload in ("dynamics", "full_step", "full_step_no_noise"):
        assert peer["threads"]["1"]["results"][workload]["64"]["steps_per_s"] > 0
        assert peer["best"][workload]["threads"] == 1
    assert peer["model"]["mass"] == pytest.approx(0.027)
    assert set(report["ratios"]) == {
        "dynamics_vs_l2f_dynamics",
        "env_vs_l2f_full_step",
        "env_vs_l2f_full_step_no_noise",
        "policy_rollout_vs_l2f_full_step",
        "actor_rollout_vs_l2f_full_step",
    }
    assert all(r > 0 for r in report["ratios"].values())


def test_peer_skips_without_l2f(bench, monkeypatch):
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    args = bench._resolve(bench.Args(peer_threads=(1,)))
    assert "skipped" in bench.run_peer(args)
