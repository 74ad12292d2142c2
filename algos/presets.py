"""Training configuration: one frozen dataclass nesting every component, and named presets."""

from __future__ import annotations

import dataclasses
from typing import Literal

from algos.ppo import PPOConfig
from policies import NetworkConfig
from sim import TASKS
from sim.quadrotor import QuadrotorConfig, RandomizationConfig


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


# One PPO recipe; the presets differ in budget only. Sample efficiency was best with many small
# updates (2048 envs × 16 steps, 4 minibatches) rather than large batches (README, "Training").
_PPO = PPOConfig(
    num_envs=2048,
    unroll_length=16,
    num_minibatches=4,
    learning_rate=2e-3,
    clip_eps=0.1,
    network=NetworkConfig(critic_hidden=(256, 256), init_log_std=-1.5),
)

PRESETS: dict[str, TrainConfig] = {
    "cpu": TrainConfig(ppo=dataclasses.replace(_PPO, total_timesteps=26_000_000)),
    "gpu": TrainConfig(ppo=dataclasses.replace(_PPO, total_timesteps=26_000_000)),
}


def get_preset(task: str, preset: str = "cpu") -> TrainConfig:
    """The named preset for `task`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    cfg = dataclasses.replace(PRESETS[preset], task=task)
    cfg.validate()
    return cfg
