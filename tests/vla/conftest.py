"""Fixtures shared by the VLA tests: one small demonstration dataset, collected once per session
(the MJX rollout's compilation is most of its cost), and one torch thread for modules that
interleave torch with JAX."""

from __future__ import annotations

import pytest
import torch

from vla.collect import make_test_dataset


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory):
    """3 scripted pick-and-place demonstrations with 32 px front and wrist images (read-only:
    tests that damage a dataset copy it first)."""
    return make_test_dataset(tmp_path_factory.mktemp("vla_demo") / "demo", episodes=3, seed=0)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module: JAX's thread pool shares the 2 CI cores, and
    spinning OpenMP threads then make torch ~20x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
