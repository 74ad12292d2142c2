"""Running observation normalizer: Chan et al. parallel update against numpy oracles."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import init_normalizer, normalize, update_normalizer


def _batches(seed: int, sizes: list[int], dim: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    loc, scale = rng.normal(0, 3, dim), rng.uniform(0.1, 4, dim)
    return [(loc + scale * rng.normal(size=(n, dim))).astype(np.float32) for n in sizes]


# Few distinct batch sizes: every new shape costs an XLA compilation of the eager ops.
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.sampled_from([1, 2, 7, 32]), min_size=1, max_size=6),
)
def test_sequential_updates_equal_numpy_moments(seed, sizes):
    batches = _batches(seed, sizes)
    ns = init_normalizer(5)
    for b in batches:
        ns = update_normalizer(ns, jnp.asarray(b))
    allx = np.concatenate(batches).astype(np.float64)
    assert float(ns.count) == len(allx)
    np.testing.assert_allclose(ns.mean, allx.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ns.var, allx.var(0), rtol=1e-4, atol=1e-6)


def test_one_batch_equals_a_loop_of_single_samples():
    (x,) = _batches(1, [64])
    whole = update_normalizer(init_normalizer(5), jnp.asarray(x))
    loop = init_normalizer(5)
    for row in x:
        loop = update_normalizer(loop, jnp.asarray(row[None]))
    np.testing.assert_allclose(loop.mean, whole.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loop.var, whole.var, rtol=1e-4)
    assert float(loop.count) == float(whole.count) == 64


def test_leading_axes_are_flattened():
    (x,) = _batches(2, [24])
    flat = update_normalizer(init_normalizer(5), jnp.asarray(x))
    nested = update_normalizer(init_normalizer(5), jnp.asarray(x.reshape(4, 6, 5)))
    np.testing.assert_array_equal(flat.mean, nested.mean)
    np.testing.assert_array_equal(flat.var, nested.var)


def test_initial_state_is_identity():
    x = jnp.asarray(_batches(3, [8])[0])
    np.testing.assert_array_equal(normalize(init_normalizer(5), x, clip=100.0), x)


def test_normalize_standardizes_and_clips():
    batches = _batches(4, [500])
    ns = update_normalizer(init_normalizer(5), jnp.asarray(batches[0]))
    z = np.asarray(normalize(ns, jnp.asarray(batches[0]), clip=100.0))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(z.std(0), 1.0, rtol=1e-3)
    far = ns.mean + 50 * jnp.sqrt(ns.var)
    np.testing.assert_allclose(normalize(ns, far[None], clip=5.0), 5.0)
    np.testing.assert_allclose(normalize(ns, -far[None], clip=5.0), -5.0)
    assert np.abs(np.asarray(normalize(ns, jnp.asarray(batches[0]) * 100))).max() <= 10.0


def test_constant_feature_stays_finite():
    x = jnp.concatenate([jnp.ones((10, 1)), jnp.arange(10.0)[:, None]], axis=1)
    ns = update_normalizer(init_normalizer(2), x)
    assert float(ns.var[0]) == 0.0
    z = normalize(ns, x + 1e-4)
    assert bool(jnp.all(jnp.isfinite(z)))
    np.testing.assert_allclose(z[:, 0], 1e-4 / 1e-3, rtol=1e-3)  # σ floored at 1e-3
