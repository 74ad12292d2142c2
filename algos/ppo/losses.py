"""PPO maths as pure functions (Schulman et al. 2017, arXiv 1707.06347; GAE: arXiv 1506.02438)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    dones: jax.Array,
    last_value: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation over a rollout.

    rewards, values, dones: [T, B]; `dones[t]` = 1 when the episode ended at step t (no bootstrap
    from values[t+1]). last_value: [B] value of the state after the last step.
    Returns (advantages [T, B], returns [T, B]).
      δ_t = r_t + γ(1 − d_t)V_{t+1} − V_t;   A_t = δ_t + γλ(1 − d_t)A_{t+1}
    """
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)

    def step(adv, xs):
        r, v, nv, d = xs
        delta = r + gamma * (1.0 - d) * nv - v
        adv = delta + gamma * gae_lambda * (1.0 - d) * adv
        return adv, adv

    _, adv = jax.lax.scan(
        step, jnp.zeros_like(last_value), (rewards, values, next_values, dones), reverse=True
    )
    return adv, adv + values


def ppo_loss(
    log_prob: jax.Array,
    old_log_prob: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    returns: jax.Array,
    entropy: jax.Array,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + value regression − entropy bonus; all inputs [N] except `entropy` [].

      L = −E[min(ρA, clip(ρ, 1 ± ε)A)] + c_v·½E[(V − R)²] − c_e·H,   ρ = exp(log π − log π_old)
    Advantages are normalized over the minibatch.
    """
    adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = jnp.exp(log_prob - old_log_prob)
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv).mean()
    vf = 0.5 * jnp.mean((values - returns) ** 2)
    loss = pg + vf_coef * vf - ent_coef * entropy
    metrics = {
        "loss/policy": pg,
        "loss/value": vf,
        "loss/entropy": entropy,
        "approx_kl": jnp.mean((ratio - 1) - jnp.log(ratio)),
        "clip_fraction": jnp.mean(jnp.abs(ratio - 1) > clip_eps),
    }
    return loss, metrics
