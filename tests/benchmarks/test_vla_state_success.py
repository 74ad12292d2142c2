"""`benchmarks/vla_state_success.py`'s pass@k: the share of states that k noise draws solve."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from vla_state_success import pass_at_k  # noqa: E402


def test_pass_at_k_counts_states_solved_at_least_once():
    # four draws of three states: always, never and once solved
    got = pass_at_k([4, 0, 1], 4)
    assert list(got) == ["1", "2", "4"]
    assert got["1"] == pytest.approx((1 + 0 + 0.25) / 3, abs=1e-4)  # the success rate
    once = 1 - math.comb(3, 2) / math.comb(4, 2)  # the solved draw among 2 of 4
    assert got["2"] == pytest.approx((1 + 0 + once) / 3, abs=1e-4)
    assert got["4"] == pytest.approx(2 / 3, abs=1e-4)  # all draws: the states ever solved
    assert pass_at_k([3, 0], 3) == {"1": 0.5, "2": 0.5}
