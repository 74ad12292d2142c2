"""Proximal Policy Optimization in JAX (Schulman et al. 2017) with an asymmetric actor-critic."""

from algos.ppo.config import PPOConfig
from algos.ppo.losses import compute_gae, ppo_loss
from algos.ppo.train import Trainer, TrainState, make_network, make_train

__all__ = [
    "PPOConfig",
    "TrainState",
    "Trainer",
    "compute_gae",
    "make_network",
    "make_train",
    "ppo_loss",
]
