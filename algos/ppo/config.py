"""PPO configuration (cleanrl/purejaxrl names)."""

from __future__ import annotations

import dataclasses

from policies import NetworkConfig


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Proximal Policy Optimization hyperparameters."""

    total_timesteps: int = 4_000_000
    """Environment steps over the whole run."""
    num_envs: int = 512
    """Parallel environments."""
    unroll_length: int = 32
    """Steps per environment per rollout."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 8
    """Minibatches per pass."""
    learning_rate: float = 1e-3
    """Adam step size (linearly annealed to `lr_final_fraction` of it)."""
    lr_final_fraction: float = 0.1
    """Final learning rate as a fraction of the initial one."""
    gamma: float = 0.99
    """Discount."""
    gae_lambda: float = 0.95
    """GAE λ."""
    clip_eps: float = 0.2
    """Policy ratio clip."""
    vf_coef: float = 0.5
    """Value loss weight."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    reward_scale: float = 0.1
    """Rewards are multiplied by this before GAE."""
    network: NetworkConfig = NetworkConfig()

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.unroll_length

    @property
    def steps_per_update(self) -> int:
        return self.batch_size

    @property
    def num_updates(self) -> int:
        return max(1, self.total_timesteps // self.batch_size)

    def validate(self) -> None:
        for name in (
            "total_timesteps",
            "num_envs",
            "unroll_length",
            "update_epochs",
            "num_minibatches",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ppo.{name} must be ≥ 1, got {getattr(self, name)}")
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num_envs·unroll_length = {self.batch_size} is not divisible by "
                f"num_minibatches = {self.num_minibatches}"
            )
        if not 0 < self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError("gamma must be in (0, 1], gae_lambda in [0, 1]")
        if self.learning_rate <= 0:
            raise ValueError("learning_rate must be > 0")
