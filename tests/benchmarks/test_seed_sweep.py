"""benchmarks/seed_sweep.py: config overrides.

A tiny end-to-end sweep (2 vmapped seeds) is not run here: inside the full suite on 2 loaded
cores it twice hung in XLA:CPU (every thread idle, the main thread waiting on a result), while
standalone runs pass; run `python benchmarks/seed_sweep.py --preset cpu --seeds 2 --set
ppo.total_timesteps=65536` to exercise it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).parents[2] / "benchmarks" / "seed_sweep.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("seed_sweep", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_unknown_override_is_refused(bench):
    with pytest.raises(ValueError, match="ppo.nope"):
        bench.override(bench.get_preset("quadrotor-hover", "cpu", "ppo"), ["ppo.nope=1"])
