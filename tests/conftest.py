"""Shared fixtures.

Compiling an env reset + step takes ~10 s on the 2-core CI CPU, so one jitted batch of random
episodes per task is built once per session here and shared between test modules (contract,
initial-state statistics, domain randomization); short sequences run eagerly instead.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

# One thread per pytest-xdist worker (and its subprocesses) for torch's OpenMP pool, set before
# anything imports torch: with two threads, a worker's torch work waits on its spinning threads
# whenever the other worker's XLA compilation holds the second core (the VLA memorization test:
# 61 s instead of 23 s beside a busy core).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax
import pytest

import sim
from algos.runner import enable_compilation_cache
from sim.quadrotor import DisturbanceConfig, InitConfig, NoiseConfig, QuadrotorConfig


def pytest_configure(config):
    """JAX's persistent compilation cache ($HOVERFLY_CACHE_DIR, else the CLI's default folder) for
    every test, as the CLI subprocesses use it: the same program compiled by another test, worker
    or subprocess is read back instead of compiled again."""
    enable_compilation_cache()


N_EPISODES = 20_000
EPISODE_STEPS = 100


class Episodes(NamedTuple):
    """A batch of random-action episodes of one registered task.

    first: states after reset, leaves [N, ...]. last: states after EPISODE_STEPS steps.
    steps: (reward [N, T], done [N, T], metrics {name: [N, T]}) after each step.
    keys: [N] episode keys. run: jit(vmap(episode)), to replay `keys`.
    """

    env: sim.Env
    first: sim.State
    last: sim.State
    steps: tuple
    keys: jax.Array
    run: Callable


def _episode(env: sim.Env, key: jax.Array):
    key_reset, key_act = jax.random.split(key)
    first = env.reset(key_reset)
    actions = jax.random.uniform(key_act, (EPISODE_STEPS, env.action_size), minval=-1, maxval=1)

    def body(s, a):
        s = env.step(s, a)
        return s, (s.reward, s.done, s.metrics)

    last, steps = jax.lax.scan(body, first, actions)
    return first, last, steps


@pytest.fixture(scope="session")
def random_episodes() -> Callable[[str], Episodes]:
    """task -> `Episodes` of `sim.make_env(task)` (default randomization), computed once."""
    cache: dict[str, Episodes] = {}

    def get(task: str) -> Episodes:
        if task not in cache:
            env = sim.make_env(task)
            run = jax.jit(jax.vmap(functools.partial(_episode, env)))
            keys = jax.random.split(jax.random.key(2024), N_EPISODES)
            cache[task] = Episodes(env, *jax.block_until_ready(run(keys)), keys, run)
        return cache[task]

    return get


@pytest.fixture(scope="session")
def hover_resets(random_episodes) -> sim.State:
    """`N_EPISODES` initial states of quadrotor-hover (leaves [N, ...])."""
    return random_episodes("quadrotor-hover").first


@pytest.fixture(scope="session")
def quiet_config() -> QuadrotorConfig:
    """Starts at rest on the target, no observation noise, no disturbance."""
    return QuadrotorConfig(
        noise=NoiseConfig(0.0, 0.0, 0.0, 0.0),
        disturbance=DisturbanceConfig(0.0, 0.0),
        init=InitConfig(at_target_prob=1.0),
    )


HOVER_RUN = Path(__file__).parent / "data" / "hover_run"


@pytest.fixture(scope="session")
def hover_run(tmp_path_factory) -> Path:
    """A fresh copy of the shipped trained run `tests/data/hover_run` (config.json and the final
    checkpoint of the README main job, `hoverfly train quadrotor-hover`, seed 0)."""
    dst = tmp_path_factory.mktemp("hover") / "run"
    shutil.copytree(HOVER_RUN, dst)
    return dst


@pytest.fixture(scope="session")
def hover_policy(hover_run):
    """The shipped run's deterministic actor as a `deploy.policy.DensePolicy`."""
    from deploy.policy import load_policy

    return load_policy(hover_run)
