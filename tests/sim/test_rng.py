"""`sim.rng` reproduces `jax.random.split`, `uniform`, `normal` and `bits` bit for bit."""

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
@pytest.mark.parametrize("shape", [(), (1,), (3,), (18,), (19,), (2, 3)])
def test_normal_and_uniform_match_jax_random(kind, shape):
    keys = KEYS[kind]
    want = jax.vmap(lambda k: jax.random.normal(k, shape))(keys)
    got = jax.jit(jax.vmap(lambda k: rng.normal(k, shape)))(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.dtype == jnp.float32 and got.shape == want.shape
    assert 0.9 < float(jnp.std(got)) < 1.1  # not a degenerate stream
    for lo, hi in [(0.0, 1.0), (-0.5, 0.5), (0.9, 1.1), (0.0, 6.0)]:
        want = jax.vmap(lambda k, lo=lo, hi=hi: jax.random.uniform(k, shape, minval=lo, maxval=hi))(
            keys
        )
        got = jax.jit(jax.vmap(lambda k, lo=lo, hi=hi: rng.uniform(k, shape, lo, hi)))(keys)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("kind", sorted(KEYS))
@pytest.mark.parametrize("num", [2, 5, 9])
def test_split_matches_jax_random(kind, num):
    keys = KEYS[kind]
    want = jax.vmap(lambda k: jax.random.split(k, num))(keys)
    got = jax.jit(jax.vmap(lambda k: rng.split(k, num)))(keys)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_data(got), _data(want))
    eager = rng.split(keys[0], num)  # unjitted, unbatched
    np.testing.assert_array_equal(_data(eager), _data(want[0]))


def _uses_jax_threefry(fn, key) -> bool:
    jaxpr = str(jax.make_jaxpr(fn)(key))
    return any(p in jaxpr for p in ("random_bits", "random_split", "threefry2x32"))


def test_threefry_keys_take_the_written_out_path():
    for key in (jax.random.key(3), jax.random.PRNGKey(3)):
        assert not _uses_jax_threefry(lambda k: rng.normal(k, (3,)), key)
        assert not _uses_jax_threefry(lambda k: rng.split(k), key)
        assert _uses_jax_threefry(lambda k: jax.random.normal(k, (3,)), key)  # the check works
        assert _uses_jax_threefry(lambda k: jax.random.split(k), key)


def test_other_generators_fall_back_to_jax_random():
    key = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(rng.normal(key, (5,)), jax.random.normal(key, (5,)))
    np.testing.assert_array_equal(_data(rng.split(key)), _data(jax.random.split(key)))
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        key = jax.random.key(3)
        np.testing.assert_array_equal(rng.uniform(key, (5,)), jax.random.uniform(key, (5,)))
    finally:
        jax.config.update("jax_threefry_partitionable", before)


@pytest.mark.parametrize("rolled", [True, False])
@pytest.mark.parametrize("kind", sorted(KEYS))
def test_bits_hash_several_keys_at_once_as_jax_random(kind, rolled):
    shapes = [(), (1,), (3,), (2, 5), (18,)]

    def draws(k):
        keys = rng.split(k, len(shapes))
        return rng.bits([(key, s) for key, s in zip(keys, shapes, strict=True)], rolled)

    keys = KEYS[kind][:300]
    got = jax.jit(jax.vmap(draws))(keys)
    for i, s in enumerate(shapes):
        want = jax.vmap(lambda k, i=i, s=s: jax.random.bits(jax.random.split(k, 5)[i], s))(keys)
        assert got[i].dtype == jnp.uint32 and got[i].shape == want.shape
        np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(want))
        u, n = rng.uniform_from_bits(got[i][0]), rng.normal_from_bits(got[i][0])
        k = jax.random.split(keys[0], 5)[i]
        np.testing.assert_array_equal(u, jax.random.uniform(k, s))
        np.testing.assert_array_equal(n, jax.random.normal(k, s))
    hlo = jax.jit(jax.vmap(draws)).lower(keys).as_text()
    assert hlo.count("stablehlo.while") == int(rolled)  # one rolled hash for all five draws


def test_other_generators_fall_back_in_bits():
    key = jax.random.key(3, impl="rbg")
    (got,) = rng.bits([(key, (4,))])
    np.testing.assert_array_equal(got, jax.random.bits(key, (4,), jnp.uint32))


@pytest.mark.parametrize("rolled", [False, True])
def test_threefry_known_answer(rolled):
    """Random123's Threefry-2x32 (20 rounds) known-answer vector: zero key, zero counter."""
    z = jnp.zeros((), jnp.uint32)
    out = (rng.threefry2x32_rolled if rolled else rng.threefry2x32)(z, z, z, z)
    assert [int(x) for x in out] == [0x6B200159, 0x99BA4EFE]
