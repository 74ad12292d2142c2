"""Soft Actor-Critic in JAX (Haarnoja et al. 2018, arXiv 1812.05905): replay buffer on the device,
automatic entropy tuning, configurable update-to-data ratio, twin critics, asymmetric critic."""

from algos.sac.config import SACConfig
from algos.sac.losses import actor_loss, alpha_loss, critic_loss, critic_target, polyak_update
from algos.sac.replay import ReplayBuffer, ReplayState
from algos.sac.train import Trainer, TrainState, make_network, make_train

__all__ = [
    "ReplayBuffer",
    "ReplayState",
    "SACConfig",
    "TrainState",
    "Trainer",
    "actor_loss",
    "alpha_loss",
    "critic_loss",
    "critic_target",
    "make_network",
    "make_train",
    "polyak_update",
]
