"""GPU-vectorized JAX simulators behind one env contract (`sim.env`), plus training wrappers.

`make_env(task, config)` builds a registered task; `TASKS` lists them.
"""

from __future__ import annotations

import dataclasses

from sim import manipulator
from sim.env import Env, State, Wrapper
from sim.quadrotor import DomainRandomization, QuadrotorConfig, QuadrotorEnv, RandomizationConfig
from sim.wrappers import (
    AutoResetWrapper,
    EpisodeWrapper,
    ObservationSubset,
    VmapWrapper,
    wrap_for_training,
)

TASKS = {
    "quadrotor-hover": "hover",
    "quadrotor-track": "track",
    "arm-reach": "reach",
    "arm-push": "push",
    "arm-pick-place": "pick_place",
}
_DEFAULT_RANDOMIZATION = RandomizationConfig()


def make_env(
    task: str,
    config: QuadrotorConfig | manipulator.ArmConfig | None = None,
    randomization: RandomizationConfig | manipulator.RandomizationConfig | None = (
        _DEFAULT_RANDOMIZATION
    ),
) -> Env:
    """Unbatched env for `task`, with domain randomization unless `randomization` is None.

    `arm-*` tasks take a `manipulator.ArmConfig` and a `manipulator.RandomizationConfig` (the
    default randomization is that family's own)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    if task.startswith("arm-"):
        return _make_arm_env(task, config, randomization)
    config = dataclasses.replace(config or QuadrotorConfig(), task=TASKS[task])
    env: Env = QuadrotorEnv(config)
    if randomization is not None:
        env = DomainRandomization(env, randomization)
    return env


def _make_arm_env(task, config, randomization) -> Env:
    if randomization is _DEFAULT_RANDOMIZATION:
        randomization = manipulator.RandomizationConfig()
    if not isinstance(config, manipulator.ArmConfig | None) or not isinstance(
        randomization, manipulator.RandomizationConfig | None
    ):
        raise ValueError(
            f"{task} needs a manipulator.ArmConfig and manipulator.RandomizationConfig"
        )
    env: Env = manipulator.ArmEnv(
        dataclasses.replace(config or manipulator.ArmConfig(), task=TASKS[task])
    )
    if randomization is not None:
        env = manipulator.DomainRandomization(env, randomization)
    return env


__all__ = [
    "TASKS",
    "AutoResetWrapper",
    "Env",
    "EpisodeWrapper",
    "ObservationSubset",
    "State",
    "VmapWrapper",
    "Wrapper",
    "make_env",
    "wrap_for_training",
]
