"""Running observation normalizer whose statistics live in the params pytree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class NormalizerState:
    """mean, var: [D] running statistics; count: [] number of samples seen."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def init_normalizer(size: int) -> NormalizerState:
    return NormalizerState(jnp.zeros(size), jnp.ones(size), jnp.zeros(()))


def update_normalizer(ns: NormalizerState, x: jax.Array) -> NormalizerState:
    """Chan et al. parallel update with a batch `x` of shape [..., D]."""
    x = x.reshape(-1, x.shape[-1])
    n = x.shape[0]
    bmean = x.mean(0)
    bvar = x.var(0)
    total = ns.count + n
    delta = bmean - ns.mean
    mean = ns.mean + delta * n / total
    m2 = ns.var * ns.count + bvar * n + delta**2 * ns.count * n / total
    return NormalizerState(mean, m2 / total, total)


def normalize(ns: NormalizerState, x: jax.Array, clip: float = 10.0) -> jax.Array:
    """(x − mean)/σ, σ floored at 1e-3 so that constant features stay finite; clipped to ±clip."""
    return jnp.clip((x - ns.mean) / jnp.maximum(jnp.sqrt(ns.var), 1e-3), -clip, clip)
