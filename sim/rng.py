"""`split`, `uniform` and `normal` as plain jnp integer ops, bit-identical to `jax.random`'s.

An env calls them on every step (a new key, observation noise) and at every reset. On XLA:CPU,
JAX lowers Threefry-2x32 as a 5-trip `while` loop, which XLA cannot fuse with the rest of the
step: vmapped over the batch, each call becomes a separate loop over `[B, n]` arrays. Written out,
its 20 rounds fuse into the step's own elementwise loops: the CPU full RL step of
`quadrotor-hover` goes from 3.4 M to 3.9–5.1 M steps/s (runs vary; `python
benchmarks/sim_throughput.py`), with the same numbers.

A reset draws a dozen values from as many keys, and there the written-out rounds cost compile time:
XLA copies each draw's rounds into every fusion that reads it (~7 copies of each in the quadrotor's
reset). `bits` hashes several draws in one rolled loop instead, whose result XLA materializes once
(on the CPU; XLA:GPU fuses the written-out draws well, see `bits`). On 2 CPU cores (three
alternating compilations against the per-key draws): the quadrotor APG update compiled in 5.7
instead of 6.6 s, the validation rollout in 2.0 instead of 2.5 s, with the same bits. Draw scalars
as shape `()`, not `(1,)` and index: the float conversion of a `[1]` slice was fused differently and
came out 1 ulp apart in some programs.

The bits are those of JAX's default, partitionable Threefry (`jax_threefry_partitionable`, on by
default since JAX 0.5): `tests/sim/test_rng.py` checks them against `jax.random`. Keys of another
implementation, or that flag turned off, go to `jax.random` itself.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k1, k2, x1, x2) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter pair (x1, x2) under the key (k1, k2), uint32."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = _rotl(x2, r) ^ x1
        x1 = x1 + ks[(i + 1) % 3]
        x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def threefry2x32_rolled(k1, k2, x1, x2) -> tuple[jax.Array, jax.Array]:
    """`threefry2x32` with its five 4-round groups in a `fori_loop` (one XLA while loop, not
    fused into the ops that read it)."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    rotations = jnp.asarray(_ROTATIONS, jnp.uint32)

    def group(i, carry):
        x1, x2, ka, kb, kc = carry  # ka, kb, kc: ks[(i + 1) % 3], ks[(i + 2) % 3], ks[i % 3]
        r = rotations[i % 2]
        for j in range(4):
            x1 = x1 + x2
            x2 = ((x2 << r[j]) | (x2 >> (np.uint32(32) - r[j]))) ^ x1
        return x1 + ka, x2 + kb + (i + 1).astype(jnp.uint32), kb, kc, ka

    init = (x1 + ks[0], x2 + ks[1], ks[1], ks[2], ks[0])
    x1, x2, *_ = jax.lax.fori_loop(0, 5, group, init)
    return x1, x2


def _key_words(key: jax.Array) -> tuple[jax.Array, jax.Array] | None:
    """(k1, k2) of a Threefry key (typed or raw uint32 [2]); None: leave it to jax.random."""
    if not jax.config.jax_threefry_partitionable:
        return None
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) != "threefry2x32":
            return None
        key = jax.random.key_data(key)
    elif key.dtype != jnp.uint32 or key.shape != (2,):
        return None
    return key[0], key[1]


def _words(k1, k2, n: int) -> tuple[jax.Array, jax.Array]:
    """Both output words for the counters 0 … n − 1 (high word 0), as JAX counts them."""
    return threefry2x32(k1, k2, jnp.zeros(n, jnp.uint32), jnp.arange(n, dtype=jnp.uint32))


def _bits(k1, k2, n: int) -> jax.Array:
    """`jax.random.bits` of n uint32 values: the two words of each counter, xor'ed."""
    b1, b2 = _words(k1, k2, n)
    return b1 ^ b2


def split(key: jax.Array, num: int = 2) -> jax.Array:
    """`jax.random.split(key, num)`: [num] keys of the same kind (an unbatched key)."""
    words = _key_words(key)
    if words is None:
        return jax.random.split(key, num)
    keys = jnp.stack(_words(*words, num), axis=-1)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        keys = jax.random.wrap_key_data(keys, impl=jax.random.key_impl(key))
    return keys


def uniform(key: jax.Array, shape: tuple[int, ...] = (), minval=0.0, maxval=1.0) -> jax.Array:
    """`jax.random.uniform(key, shape, float32, minval, maxval)` (an unbatched key)."""
    words = _key_words(key)
    if words is None:
        return jax.random.uniform(key, shape, jnp.float32, minval, maxval)
    return uniform_from_bits(_bits(*words, math.prod(shape)).reshape(shape), minval, maxval)


def bits(
    requests: list[tuple[jax.Array, tuple[int, ...]]], rolled: bool | None = None
) -> list[jax.Array]:
    """`jax.random.bits(key, shape, uint32)` for each (key, shape) of `requests` (unbatched keys);
    `uniform_from_bits` and `normal_from_bits` turn them into `uniform`'s and `normal`'s values.

    rolled: all of them hashed in one rolled Threefry call (module docstring), or each written
    out; None: rolled on the CPU only. XLA:GPU fuses the written-out draws into their readers, and
    there the rolled loop made the H200's policy rollout ~10 % slower (1.38e9 against 1.52e9
    steps/s, README "Simulator throughput"); one written-out hash of all the draws at once was
    slower still (8.8e8)."""
    words = [_key_words(key) for key, _ in requests]
    if any(w is None for w in words):
        return [jax.random.bits(key, shape, jnp.uint32) for key, shape in requests]
    sizes = [math.prod(shape) for _, shape in requests]
    if rolled is None:
        rolled = jax.default_backend() == "cpu"
    if not rolled:
        return [
            _bits(*w, n).reshape(shape)
            for w, n, (_, shape) in zip(words, sizes, requests, strict=True)
        ]
    k1, k2 = (
        jnp.concatenate([jnp.broadcast_to(w[i], (n,)) for w, n in zip(words, sizes, strict=True)])
        for i in (0, 1)
    )
    counters = np.concatenate([np.arange(n, dtype=np.uint32) for n in sizes])
    b1, b2 = threefry2x32_rolled(k1, k2, jnp.zeros_like(counters), jnp.asarray(counters))
    flat, ends = b1 ^ b2, np.cumsum(sizes)
    return [
        flat[end - n : end].reshape(shape)
        for (_, shape), n, end in zip(requests, sizes, ends, strict=True)
    ]


def uniform_from_bits(bits: jax.Array, minval=0.0, maxval=1.0) -> jax.Array:
    """float32 in [minval, maxval) from uint32 `bits` (the high 23 as the mantissa), as
    `jax.random.uniform` converts them."""
    mantissa = (bits >> np.uint32(32 - 23)) | np.float32(1.0).view(np.uint32)
    floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1.0)
    lo, hi = np.float32(minval), np.float32(maxval)
    return jnp.maximum(lo, floats * (hi - lo) + lo)


NORMAL_LOW = float(np.nextafter(np.float32(-1.0), np.float32(0.0)))
"""Lower bound of the uniform draw that `normal` maps through erf⁻¹."""


def normal(key: jax.Array, shape: tuple[int, ...] = ()) -> jax.Array:
    """`jax.random.normal(key, shape)`, float32 (an unbatched key): its own formula over
    `uniform`, so other generators fall back through `uniform`."""
    return normal_from_uniform(uniform(key, shape, NORMAL_LOW, 1.0))


def normal_from_bits(bits: jax.Array) -> jax.Array:
    """N(0, 1) from uint32 `bits`, as `normal` converts them."""
    return normal_from_uniform(uniform_from_bits(bits, NORMAL_LOW, 1.0))


def normal_from_uniform(u: jax.Array) -> jax.Array:
    """N(0, 1) from `u` ~ U(NORMAL_LOW, 1): √2·erf⁻¹(u), as `jax.random.normal`."""
    return np.float32(np.sqrt(2)) * jax.lax.erf_inv(u)
