"""`sim.rng` reproduces `jax.random.split` and `jax.random.normal` bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sim import rng


def _data(keys: jax.Array) -> np.ndarray:
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        keys = jax.random.key_data(keys)
    return np.asarray(keys)


KEYS = {
    "typed": jax.random.split(jax.random.key(7), 2000),
    "raw": jax.vmap(jax.random.PRNGKey)(jnp.arange(2000)),
}


@pytest.mark.parametrize("kind", sorted(KEYS))
@pytest.mark.parametrize("n", [1, 2, 18, 19])
def test_normal_matches_jax_random(kind, n):
    keys = KEYS[kind]
    want = jax.vmap(lambda k: jax.random.normal(k, (n,)))(keys)
    got = jax.jit(jax.vmap(lambda k: rng.normal(k, n)))(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.dtype == jnp.float32
    assert 0.9 < float(jnp.std(got)) < 1.1  # not a degenerate stream


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_split_matches_jax_random(kind):
    keys = KEYS[kind]
    want = jax.vmap(jax.random.split)(keys)
    a, b = jax.jit(jax.vmap(rng.split))(keys)
    assert a.dtype == keys.dtype and a.shape == keys.shape
    np.testing.assert_array_equal(_data(a), _data(want[:, 0]))
    np.testing.assert_array_equal(_data(b), _data(want[:, 1]))
    eager = rng.split(keys[0])  # unjitted, unbatched
    np.testing.assert_array_equal(_data(eager[1]), _data(want[0, 1]))


def test_other_generators_fall_back_to_jax_random():
    key = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(rng.normal(key, 5), jax.random.normal(key, (5,)))
    np.testing.assert_array_equal(_data(rng.split(key)[1]), _data(jax.random.split(key)[1]))
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        key = jax.random.key(3)
        np.testing.assert_array_equal(rng.normal(key, 5), jax.random.normal(key, (5,)))
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def test_threefry_known_answer():
    """Random123's Threefry-2x32 (20 rounds) known-answer vector: zero key, zero counter."""
    z = jnp.zeros((), jnp.uint32)
    out = rng.threefry2x32(z, z, z, z)
    assert [int(x) for x in out] == [0x6B200159, 0x99BA4EFE]
