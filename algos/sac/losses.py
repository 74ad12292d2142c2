"""SAC maths as pure functions (Haarnoja et al. 2018, arXiv 1801.01290 and 1812.05905).

Batch arrays are [B]; twin-critic outputs are [2, B]. Time-outs: a truncated transition's next
observation was replaced by the auto-reset, so it is left out of the critic loss (`mask` 0) rather
than treated as terminal (brax SAC's rule); terminations cut the bootstrap (`done` 1).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def critic_target(
    reward: jax.Array,
    done: jax.Array,
    next_q: jax.Array,
    next_log_prob: jax.Array,
    alpha: jax.Array,
    gamma: float,
) -> jax.Array:
    """Soft Bellman target [B], gradient stopped:
    y = r + γ(1 − d)(min_i Q̄_i(s', a') − α log π(a'|s')),  a' ~ π(·|s')."""
    soft_v = jnp.min(next_q, axis=0) - alpha * next_log_prob
    return jax.lax.stop_gradient(reward + gamma * (1.0 - done) * soft_v)


def critic_loss(q: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
    """½ Σ_i mean_b[mask (Q_i − y)²] over the unmasked transitions; q [2, B], target/mask [B]."""
    sq = jnp.sum((q - target[None]) ** 2, axis=0)
    return 0.5 * jnp.sum(mask * sq) / jnp.maximum(jnp.sum(mask), 1.0)


def actor_loss(q: jax.Array, log_prob: jax.Array, alpha: jax.Array) -> jax.Array:
    """E[α log π(a|s) − min_i Q_i(s, a)] with a ~ π reparameterized; q [2, B], log_prob [B]."""
    return jnp.mean(alpha * log_prob - jnp.min(q, axis=0))


def alpha_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """−E[α (log π + H̄)] (cleanrl's form): its gradient raises α while the policy's entropy
    −E[log π] is below the target H̄ and lowers it above."""
    return -jnp.mean(jnp.exp(log_alpha) * jax.lax.stop_gradient(log_prob + target_entropy))


def polyak_update(online: Any, target: Any, tau: float) -> Any:
    """θ̄ ← τ θ + (1 − τ) θ̄, leaf by leaf."""
    return jax.tree.map(lambda o, t: tau * o + (1.0 - tau) * t, online, target)
