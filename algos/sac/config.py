"""SAC configuration (cleanrl names where they exist)."""

from __future__ import annotations

import dataclasses

from policies import NetworkConfig


@dataclasses.dataclass(frozen=True)
class SACConfig:
    """Soft Actor-Critic hyperparameters. One update collects `unroll_length` steps from each of
    `num_envs` envs, then takes utd_ratio · num_envs · unroll_length gradient steps."""

    total_timesteps: int = 1_000_000
    """Environment steps over the whole run."""
    num_envs: int = 32
    """Parallel environments."""
    unroll_length: int = 32
    """Steps per environment per update."""
    utd_ratio: float = 0.125
    """Update-to-data ratio: gradient steps per environment step (× num_envs·unroll_length must
    be a whole number)."""
    learning_starts: int = 10_000
    """Transitions in the replay buffer before gradient steps begin (counted again after a resume:
    the buffer is not checkpointed)."""
    buffer_size: int = 500_000
    """Replay capacity in transitions (on the device)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    actor_lr: float = 1e-3
    """Adam step size of the actor (mean network and log σ)."""
    critic_lr: float = 1e-3
    """Adam step size of the twin critics."""
    alpha_lr: float = 1e-3
    """Adam step size of the temperature log α."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate of the target critics."""
    init_alpha: float = 0.02
    """Initial entropy temperature α."""
    target_entropy_scale: float = 1.0
    """Target entropy H̄ = −target_entropy_scale · |A| (SAC's −|A| at 1)."""
    reward_scale: float = 0.1
    """Rewards are multiplied by this before learning."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip of each optimizer."""
    network: NetworkConfig = NetworkConfig(critic_hidden=(64, 64), init_log_std=-2.0)
    """Actor: PPO's 64-64 tanh MLP (same export path). Critic 64-64 as L2F's TD3: on a 2-core
    CPU a gradient step costs ∝ critic width² (256-256 was 4× slower per step)."""

    @property
    def steps_per_update(self) -> int:
        """Environment steps per update."""
        return self.num_envs * self.unroll_length

    @property
    def grad_steps(self) -> int:
        """Gradient steps per update."""
        return round(self.utd_ratio * self.steps_per_update)

    @property
    def num_updates(self) -> int:
        return max(1, self.total_timesteps // self.steps_per_update)

    def validate(self) -> None:
        for name in (
            "total_timesteps",
            "num_envs",
            "unroll_length",
            "learning_starts",
            "buffer_size",
            "batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"sac.{name} must be ≥ 1, got {getattr(self, name)}")
        exact = self.utd_ratio * self.steps_per_update
        if self.grad_steps < 1 or abs(exact - self.grad_steps) > 1e-6:
            raise ValueError(
                f"sac.utd_ratio · num_envs · unroll_length = {exact:g} must be a whole number ≥ 1"
            )
        if self.buffer_size < max(self.steps_per_update, self.learning_starts):
            raise ValueError(
                f"sac.buffer_size = {self.buffer_size} must hold learning_starts and one update "
                f"({max(self.steps_per_update, self.learning_starts)} transitions)"
            )
        if self.learning_starts < self.batch_size:
            raise ValueError("sac.learning_starts must be ≥ sac.batch_size")
        if not 0 < self.gamma <= 1 or not 0 < self.tau <= 1:
            raise ValueError("sac.gamma and sac.tau must be in (0, 1]")
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha", "reward_scale"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sac.{name} must be > 0, got {getattr(self, name)}")
