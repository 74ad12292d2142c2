"""Flax networks (MLP actor-critic with an asymmetric critic), normalizers and action heads, and
the deterministic actor as one Pallas kernel over batch-last observations (`make_pallas_actor`).

Everything is pure init/apply."""

from policies.actor_critic import (
    ActorCritic,
    NetworkConfig,
    gaussian_entropy,
    gaussian_log_prob,
    make_actor_critic,
    make_policy,
    mlp_tap_grads,
)
from policies.normalizer import NormalizerState, init_normalizer, normalize, update_normalizer
from policies.pallas_actor import make_pallas_actor

__all__ = [
    "ActorCritic",
    "NetworkConfig",
    "NormalizerState",
    "gaussian_entropy",
    "gaussian_log_prob",
    "init_normalizer",
    "make_actor_critic",
    "make_pallas_actor",
    "make_policy",
    "mlp_tap_grads",
    "normalize",
    "update_normalizer",
]
