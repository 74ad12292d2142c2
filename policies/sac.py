"""Tanh-squashed Gaussian actor and twin Q critics for SAC (Haarnoja et al. 2018, arXiv 1812.05905).

`make_sac_networks(cfg, obs_size, critic_obs_size, act_size)` returns pure functions over a params
dict {"actor", "log_std", "critic", "target_critic", "log_alpha", "obs_norm", "critic_norm"}:

- "actor", "log_std", "obs_norm" have the layout of the PPO actor (`policies.actor_critic`): the
  same MLP (obs → A, on the normalized observation) and a state-independent log σ [A]. The MLP's
  output is the *pre-squash* mean u; the action is a = tanh(u + σε), the deterministic action
  tanh(u). An exporter of a PPO actor therefore needs only a tanh on the output instead of a clip.
- "critic" and "target_critic" are twin Q networks on (normalized critic observation, action);
  the target is a Polyak copy. "log_alpha" [] is the entropy temperature log α.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from policies.actor_critic import ACTIVATIONS, MLP, NetworkConfig, gaussian_log_prob
from policies.normalizer import NormalizerState, init_normalizer, normalize

Params = dict[str, Any]
LOG_STD_MIN, LOG_STD_MAX = -5.0, 1.0
"""Bounds of the actor's log σ (pre-squash)."""


class TwinQ(nn.Module):
    """Two independent MLP critics Q_1, Q_2 on concat(obs, action); output [2, ...]."""

    hidden: tuple[int, ...]
    activation: Callable[[jax.Array], jax.Array]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        # One batched network (kernels [2, in, out]): half the ops of two separate ones.
        twin = nn.vmap(
            MLP,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            axis_size=2,
        )
        x = jnp.concatenate([obs, action], axis=-1)
        return twin(self.hidden, 1, self.activation)(x)[..., 0]


class SACNetworks(NamedTuple):
    """Pure functions of the SAC networks.

    init(key) -> params (target critic = critic, α = `init_alpha`)
    actor(params, obs [..., O]) -> (pre-squash mean [..., A], log σ [A])  (normalizes inside)
    critic(critic_params, critic_norm, critic_obs [..., C], action [..., A]) -> Q [2, ...]
    """

    init: Callable[[jax.Array], Params]
    actor: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]]
    critic: Callable[[Any, NormalizerState, jax.Array, jax.Array], jax.Array]


def make_sac_networks(
    cfg: NetworkConfig,
    obs_size: int,
    critic_obs_size: int,
    act_size: int,
    action_bias: jax.Array | float = 0.0,
    init_alpha: float = 1.0,
) -> SACNetworks:
    """`action_bias` ∈ (−1, 1) [A] or []: the initial deterministic action (e.g. the hover
    command), reached through the output bias arctanh(action_bias)."""
    act = ACTIVATIONS[cfg.activation]
    bias = jnp.arctanh(jnp.clip(jnp.broadcast_to(action_bias, (act_size,)), -0.99, 0.99))
    actor_net = MLP(cfg.actor_hidden, act_size, act, out_scale=0.01)
    critic_net = TwinQ(tuple(cfg.critic_hidden), act)

    def init(key: jax.Array) -> Params:
        key_actor, key_critic = jax.random.split(key)
        actor = actor_net.init(key_actor, jnp.zeros((1, obs_size)))
        dense = actor["params"][f"Dense_{len(cfg.actor_hidden)}"]
        actor["params"][f"Dense_{len(cfg.actor_hidden)}"] = {**dense, "bias": bias}
        critic = critic_net.init(
            key_critic, jnp.zeros((1, critic_obs_size)), jnp.zeros((1, act_size))
        )
        return {
            "actor": actor,
            "log_std": jnp.full((act_size,), cfg.init_log_std, jnp.float32),
            "critic": critic,
            "target_critic": jax.tree.map(jnp.copy, critic),
            "log_alpha": jnp.log(jnp.asarray(init_alpha, jnp.float32)),
            "obs_norm": init_normalizer(obs_size),
            "critic_norm": init_normalizer(critic_obs_size),
        }

    def actor(params: Params, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean = actor_net.apply(params["actor"], normalize(params["obs_norm"], obs))
        return mean, jnp.clip(params["log_std"], LOG_STD_MIN, LOG_STD_MAX)

    def critic(critic_params, norm: NormalizerState, critic_obs: jax.Array, action: jax.Array):
        return critic_net.apply(critic_params, normalize(norm, critic_obs), action)

    return SACNetworks(init, actor, critic)


def sample_squashed(
    mean: jax.Array, log_std: jax.Array, key: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """a = tanh(u), u = mean + σε (reparameterized). mean [..., A], log_std [A] or [..., A].

    Returns (a [..., A], log π(a) [...]):  log π(a) = log N(u; mean, σ) − Σ log(1 − tanh²u),
    with log(1 − tanh²u) = 2(log 2 − u − softplus(−2u)) (stable for large |u|).
    """
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    log_det = jnp.sum(2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u)), axis=-1)
    return jnp.tanh(u), gaussian_log_prob(mean, log_std, u) - log_det


def make_sac_policy(net: SACNetworks, params: Params, deterministic: bool = False) -> Callable:
    """policy(obs [..., O], key) -> (action [..., A] in (−1, 1), extras); the deterministic
    action is tanh(mean), the stochastic one a squashed sample with its `log_prob` in extras."""

    def policy(obs: jax.Array, key: jax.Array) -> tuple[jax.Array, dict]:
        mean, log_std = net.actor(params, obs)
        if deterministic:
            return jnp.tanh(mean), {}
        action, log_prob = sample_squashed(mean, log_std, key)
        return action, {"log_prob": log_prob}

    return policy
