"""Fixtures shared by the VLA tests: one small demonstration dataset, collected once per session
(the MJX rollout's compilation is most of its cost)."""

from __future__ import annotations

import pytest

from vla.collect import make_test_dataset


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory):
    """3 scripted pick-and-place demonstrations with 32 px front and wrist images (read-only:
    tests that damage a dataset copy it first)."""
    return make_test_dataset(tmp_path_factory.mktemp("vla_demo") / "demo", episodes=3, seed=0)
