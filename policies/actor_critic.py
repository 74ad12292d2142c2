"""MLP actor-critic with a Gaussian head; the critic may read the privileged observation.

`make_actor_critic(cfg, obs_size, critic_obs_size, act_size)` returns pure `init/apply` functions
over a params dict {"actor", "critic", "log_std", "obs_norm", "critic_norm"}: the normalizer
statistics travel with the weights, so a checkpoint alone rebuilds the deployed policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from policies.normalizer import init_normalizer, normalize

Params = dict[str, Any]

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "elu": nn.elu, "silu": nn.silu}


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """Actor-critic architecture."""

    actor_hidden: tuple[int, ...] = (64, 64)
    """Actor hidden layer widths."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Critic hidden layer widths."""
    activation: Literal["tanh", "relu", "elu", "silu"] = "tanh"
    """Hidden activation."""
    asymmetric: bool = True
    """Critic reads the privileged observation instead of the actor's."""
    init_log_std: float = -1.0
    """Initial log standard deviation of the Gaussian action head."""


class MLP(nn.Module):
    """Dense layers with `activation` between them; `bias_init` sets the output layer's bias."""

    hidden: Sequence[int]
    out: int
    activation: Callable[[jax.Array], jax.Array]
    out_scale: float = 1.0
    out_bias: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = self.activation(nn.Dense(width, kernel_init=nn.initializers.orthogonal(2**0.5))(x))
        return nn.Dense(
            self.out,
            kernel_init=nn.initializers.orthogonal(self.out_scale),
            bias_init=nn.initializers.constant(self.out_bias),
        )(x)


class ActorCritic(NamedTuple):
    """Pure functions of an actor-critic.

    init(key) -> params
    actor(params, obs [..., obs]) -> (mean [..., A], log_std [A])  (normalizes inside)
    actor_taps(params, obs, taps) -> (mean, inputs): the actor's mean with `taps[i]` added to its
        Dense layer i's output, and each Dense layer's input (`mlp_taps`)
    critic(params, critic_obs [..., C]) -> value [...]
    """

    init: Callable[[jax.Array], Params]
    actor: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]]
    actor_taps: Callable[[Params, jax.Array, Sequence[jax.Array]], tuple[jax.Array, list]]
    critic: Callable[[Params, jax.Array], jax.Array]


def mlp_taps(
    variables: Params, x: jax.Array, activation: Callable, taps: Sequence[jax.Array]
) -> tuple[jax.Array, list[jax.Array]]:
    """`MLP.apply(variables, x)` with `taps[i]` added to Dense layer i's output; also returns
    each Dense layer's input.

    The gradient with respect to `taps[i]` is the cotangent g of layer i's output, so that
    layer's kernel gradient is inputᵀ g and its bias gradient Σ g (`mlp_tap_grads`). A learner
    that runs the network at every step of a differentiated loop can feed it stopped weights and
    zero taps and form the weight gradients after the loop, one matrix product over all steps
    (`algos.apg`), instead of one per step inside the backward loop.
    """
    dense = variables["params"]
    if len(taps) != len(dense):
        raise ValueError(f"mlp_taps: {len(taps)} taps for an MLP of {len(dense)} Dense layers")
    inputs = []
    for i, tap in enumerate(taps):
        layer = dense[f"Dense_{i}"]
        inputs.append(x)
        x = x @ layer["kernel"] + layer["bias"] + tap
        if i < len(taps) - 1:
            x = activation(x)
    return x, inputs


def mlp_tap_grads(inputs: Sequence[jax.Array], cotangents: Sequence[jax.Array]) -> Params:
    """The MLP's weight gradients, in its variables' structure, from `mlp_taps`' layer inputs and
    the taps' cotangents over any leading axes (steps, envs): kernel Σ xᵀg, bias Σ g."""
    dense = {}
    for i, (x, g) in enumerate(zip(inputs, cotangents, strict=True)):
        # named axes in this order (not "..."): the order they are summed in sets the float bits
        lead = "zyxwvu"[: g.ndim - 1]
        kernel = jnp.einsum(f"{lead}i,{lead}o->io", x, g)
        dense[f"Dense_{i}"] = {"kernel": kernel, "bias": g.sum(tuple(range(g.ndim - 1)))}
    return {"params": dense}


def make_actor_critic(
    cfg: NetworkConfig,
    obs_size: int,
    critic_obs_size: int,
    act_size: int,
    action_bias: float = 0.0,
) -> ActorCritic:
    """`action_bias` initializes the mean head (e.g. the hover command): training starts there."""
    act = ACTIVATIONS[cfg.activation]
    actor_net = MLP(cfg.actor_hidden, act_size, act, out_scale=0.01, out_bias=action_bias)
    critic_net = MLP(cfg.critic_hidden, 1, act, out_scale=1.0)

    def init(key: jax.Array) -> Params:
        key_actor, key_critic = jax.random.split(key)
        return {
            "actor": actor_net.init(key_actor, jnp.zeros((1, obs_size))),
            "critic": critic_net.init(key_critic, jnp.zeros((1, critic_obs_size))),
            "log_std": jnp.full((act_size,), cfg.init_log_std, jnp.float32),
            "obs_norm": init_normalizer(obs_size),
            "critic_norm": init_normalizer(critic_obs_size),
        }

    def actor(params: Params, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        return actor_net.apply(params["actor"], normalize(params["obs_norm"], obs)), params[
            "log_std"
        ]

    def actor_taps(params: Params, obs: jax.Array, taps: Sequence[jax.Array]):
        return mlp_taps(params["actor"], normalize(params["obs_norm"], obs), act, taps)

    def critic(params: Params, critic_obs: jax.Array) -> jax.Array:
        x = normalize(params["critic_norm"], critic_obs)
        return critic_net.apply(params["critic"], x)[..., 0]

    return ActorCritic(init, actor, actor_taps, critic)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    """Sum over the last axis of the diagonal Gaussian log-density."""
    z = (x - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)


def gaussian_entropy(log_std: jax.Array) -> jax.Array:
    return jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e), axis=-1)


def make_policy(ac: ActorCritic, params: Params, deterministic: bool = False) -> Callable:
    """policy(obs [..., obs], key) -> (action [..., A] clipped to [-1, 1], extras)."""

    def policy(obs: jax.Array, key: jax.Array) -> tuple[jax.Array, dict]:
        mean, log_std = ac.actor(params, obs)
        if deterministic:
            return jnp.clip(mean, -1.0, 1.0), {}
        raw = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        return jnp.clip(raw, -1.0, 1.0), {
            "raw_action": raw,
            "log_prob": gaussian_log_prob(mean, log_std, raw),
        }

    return policy
