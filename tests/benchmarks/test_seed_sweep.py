"""benchmarks/seed_sweep.py on a tiny config: one JSON object, one rate per seed, overrides."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

PATH = Path(__file__).parents[2] / "benchmarks" / "seed_sweep.py"
TINY = [
    "ppo.total_timesteps=4096",
    "ppo.num_envs=64",
    "ppo.unroll_length=32",
    "ppo.network.critic_hidden=[64, 64]",
    "eval.episodes=8",
]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("seed_sweep", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_sweep_reports_every_seed(bench, tmp_path, capsys):
    args = ["--preset", "cpu", "--seeds", "2", "--eval-every", "1", "--out", tmp_path / "s.json"]
    result = bench.main([str(a) for a in args] + [f"--set={s}" for s in TINY])
    assert (
        json.loads(capsys.readouterr().out)
        == result
        == json.loads((tmp_path / "s.json").read_text())
    )
    assert len(result["curve"]) == 2 and len(result["final_success"]) == 2
    assert all(0.0 <= r <= 1.0 for r in result["final_success"])
    assert result["final_seeds_ok"] == sum(r >= 0.95 for r in result["final_success"])


def test_unknown_override_is_refused(bench):
    with pytest.raises(SystemExit, match="ppo.nope"):
        bench.override(bench.get_preset("quadrotor-hover", "cpu"), ["ppo.nope=1"])
