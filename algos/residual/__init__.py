"""Residual RL: a bounded correction trained on top of a frozen base policy, as an env wrapper that
PPO and SAC train unchanged (a classical controller, a trained run, or a frozen VLA, registered
by `vla.residual`, as the base)."""

from algos.residual.base import (
    BaseFactory,
    BasePolicy,
    base_from_callable,
    base_from_run,
    register_base,
    registered_base,
    zero_policy,
)
from algos.residual.config import VLA_BASES, ObsAugmentation, ResidualConfig, ResidualScale
from algos.residual.wrapper import ResidualWrapper, field_layout, residual_scale

__all__ = [
    "BaseFactory",
    "BasePolicy",
    "ObsAugmentation",
    "ResidualConfig",
    "ResidualScale",
    "ResidualWrapper",
    "VLA_BASES",
    "base_from_callable",
    "base_from_run",
    "field_layout",
    "register_base",
    "registered_base",
    "residual_scale",
    "zero_policy",
]
