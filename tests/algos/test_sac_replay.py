"""Ring semantics of the device replay buffer: wrap-around, fill count, sampling filled slots."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.sac import ReplayBuffer


def batch(start: int, n: int) -> dict:
    ids = jnp.arange(start, start + n, dtype=jnp.float32)
    return {"id": ids, "obs": jnp.stack([ids, -ids], axis=-1)}


def test_insert_wraps_around_and_overwrites_the_oldest():
    buf = ReplayBuffer(5)
    rs = buf.init({"id": jnp.zeros(()), "obs": jnp.zeros(2)})
    assert rs.data["obs"].shape == (5, 2) and int(rs.size) == 0
    rs = buf.insert(rs, batch(1, 3))  # slots 0-2 ← 1, 2, 3
    assert int(rs.position) == 3 and int(rs.size) == 3
    np.testing.assert_array_equal(rs.data["id"], [1, 2, 3, 0, 0])
    rs = buf.insert(rs, batch(4, 4))  # slots 3, 4, 0, 1 ← 4, 5, 6, 7
    assert int(rs.position) == 2 and int(rs.size) == 5
    np.testing.assert_array_equal(rs.data["id"], [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(rs.data["obs"][:, 1], -rs.data["id"])
    rs = jax.jit(buf.insert)(rs, batch(8, 5))  # slots 2, 3, 4, 0, 1 ← 8…12 (jitted)
    np.testing.assert_array_equal(rs.data["id"], [11, 12, 8, 9, 10])
    assert int(rs.position) == 2 and int(rs.size) == 5
    with pytest.raises(ValueError, match="exceeds the capacity"):
        buf.insert(rs, batch(0, 6))


def test_sampling_draws_only_filled_slots_and_all_of_them():
    buf = ReplayBuffer(100)
    rs = buf.insert(buf.init({"id": jnp.zeros(()), "obs": jnp.zeros(2)}), batch(1, 7))
    out = buf.sample(rs, jax.random.key(0), 2000)
    ids = np.asarray(out["id"])
    assert set(ids.tolist()) == set(range(1, 8))  # never an empty (zero) slot
    np.testing.assert_array_equal(np.asarray(out["obs"])[:, 1], -ids)  # rows stay together
    counts = np.bincount(ids.astype(int))[1:]
    assert counts.min() > 2000 / 7 * 0.7  # roughly uniform
    again = buf.sample(rs, jax.random.key(0), 2000)
    np.testing.assert_array_equal(again["id"], ids)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)
