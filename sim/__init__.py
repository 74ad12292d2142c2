"""GPU-vectorized JAX simulators behind one env contract (`sim.env`), plus training wrappers.

`make_env(task, config)` builds a registered task; `TASKS` lists them.
"""

from __future__ import annotations

import dataclasses

from sim.env import Env, State, Wrapper
from sim.quadrotor import DomainRandomization, QuadrotorConfig, QuadrotorEnv, RandomizationConfig
from sim.wrappers import AutoResetWrapper, EpisodeWrapper, VmapWrapper, wrap_for_training

TASKS = {"quadrotor-hover": "hover", "quadrotor-track": "track"}
_DEFAULT_RANDOMIZATION = RandomizationConfig()


def make_env(
    task: str,
    config: QuadrotorConfig | None = None,
    randomization: RandomizationConfig | None = _DEFAULT_RANDOMIZATION,
) -> Env:
    """Unbatched env for `task`, with domain randomization unless `randomization` is None."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    config = dataclasses.replace(config or QuadrotorConfig(), task=TASKS[task])
    env: Env = QuadrotorEnv(config)
    if randomization is not None:
        env = DomainRandomization(env, randomization)
    return env


__all__ = [
    "TASKS",
    "AutoResetWrapper",
    "Env",
    "EpisodeWrapper",
    "State",
    "VmapWrapper",
    "Wrapper",
    "make_env",
    "wrap_for_training",
]
