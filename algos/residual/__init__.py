"""Residual RL: a bounded correction trained on top of a frozen base policy, as an env wrapper that
PPO and SAC train unchanged (a classical controller, a trained run, or later a VLA as the base)."""

from algos.residual.base import BasePolicy, base_from_callable, base_from_run, zero_policy
from algos.residual.config import ObsAugmentation, ResidualConfig, ResidualScale
from algos.residual.wrapper import ResidualWrapper, field_layout, residual_scale

__all__ = [
    "BasePolicy",
    "ObsAugmentation",
    "ResidualConfig",
    "ResidualScale",
    "ResidualWrapper",
    "base_from_callable",
    "base_from_run",
    "field_layout",
    "residual_scale",
    "zero_policy",
]
