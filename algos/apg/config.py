"""Analytic policy gradient configuration."""

from __future__ import annotations

import dataclasses

from policies import NetworkConfig


@dataclasses.dataclass(frozen=True)
class APGConfig:
    """Analytic policy gradient hyperparameters: each update backpropagates the summed reward of
    `horizon` steps of `num_envs` envs through the simulator into the deterministic actor."""

    total_timesteps: int = 10_240_000
    """Environment steps over the whole run."""
    num_envs: int = 32
    """Parallel environments (few: an update's gradient averages 32 × 100 steps already, and
    over 20–60 seeds on the H200 32 envs reached 96 % validation after 1.5 M steps, 128 after
    3.5 M; README, "Training on the quadrotor")."""
    horizon: int = 100
    """Steps per environment per update, differentiated through (truncated BPTT window)."""
    learning_rate: float = 3e-3
    """Adam step size (linearly annealed to `lr_final_fraction` of it)."""
    lr_final_fraction: float = 0.1
    """Final learning rate as a fraction of the initial one."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    unroll: int = 1
    """`lax.scan` unroll of the window's steps. On a GPU, where an update is a chain of small
    kernels, 4 (the GPU preset) cut an H100 update from 40 to 19 ms and doubled its compilation
    (README, "Training on the quadrotor"); on the CPU it multiplies the compilation."""
    action_noise: float = 0.0
    """σ of Gaussian exploration noise added to the actions while training (reparameterized)."""
    network: NetworkConfig = NetworkConfig(critic_hidden=())
    """The actor is trained; the critic (a linear head here) is unused."""

    @property
    def steps_per_update(self) -> int:
        return self.num_envs * self.horizon

    @property
    def num_updates(self) -> int:
        return max(1, self.total_timesteps // self.steps_per_update)

    def validate(self) -> None:
        for name in ("total_timesteps", "num_envs", "horizon", "unroll"):
            if getattr(self, name) < 1:
                raise ValueError(f"apg.{name} must be ≥ 1, got {getattr(self, name)}")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0 or self.action_noise < 0:
            raise ValueError("apg needs learning_rate > 0, max_grad_norm > 0, action_noise ≥ 0")
