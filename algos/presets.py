"""Training configuration: one frozen dataclass nesting every component, and named presets."""

from __future__ import annotations

import dataclasses
from typing import Literal

from algos.ppo import PPOConfig
from policies import NetworkConfig
from sim import TASKS
from sim.quadrotor import QuadrotorConfig, RandomizationConfig, RewardConfig


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Closed-loop evaluation protocol (success: never terminates and the mean position error over
    the final `settle_seconds` is ≤ `tolerance`)."""

    episodes: int = 1000
    """Episodes, each from the wide initial-state distribution under randomized dynamics."""
    seconds: float = 5.0
    """Episode length, s."""
    settle_seconds: float = 2.0
    """Window at the end of the episode over which the position error is averaged, s."""
    tolerance: float = 0.1
    """Success threshold on that mean position error, m."""
    seed: int = 12345
    """Evaluation key (fixed, so that runs are compared on the same episodes)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs; saved resolved as `config.json` in the run folder."""

    task: str = "quadrotor-hover"
    """Registered task name."""
    algo: Literal["ppo"] = "ppo"
    """Learner."""
    seed: int = 0
    """Seed of the single PRNG key the run starts from."""
    env: QuadrotorConfig = QuadrotorConfig()
    randomization: RandomizationConfig = RandomizationConfig()
    ppo: PPOConfig = PPOConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint_every: int = 20
    """Updates between checkpoints."""

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose from {sorted(TASKS)}")
        self.ppo.validate()


_REWARD = RewardConfig(
    position=1.0,
    position_final=1.0,
    orientation=1.0,
    velocity=0.1,
    velocity_final=0.1,
    termination=50.0,
)
_ENV = QuadrotorConfig(action_history=8, reward=_REWARD)

PRESETS: dict[str, TrainConfig] = {
    "cpu": TrainConfig(
        env=_ENV,
        ppo=PPOConfig(
            total_timesteps=3_000_000,
            num_envs=512,
            unroll_length=32,
            network=NetworkConfig(critic_hidden=(64, 64)),
        ),
    ),
    "gpu": TrainConfig(
        env=_ENV,
        ppo=PPOConfig(
            total_timesteps=20_000_000,
            num_envs=8192,
            unroll_length=32,
            num_minibatches=4,
            network=NetworkConfig(critic_hidden=(256, 256)),
        ),
    ),
}


def get_preset(task: str, preset: str = "cpu") -> TrainConfig:
    """The named preset for `task`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    cfg = dataclasses.replace(PRESETS[preset], task=task)
    cfg.validate()
    return cfg
