"""Ring replay buffer on the device (after brax `training/replay_buffers.py`): `ReplayBuffer` is
a stateless bundle of pure functions over `ReplayState`.

The buffer lives in the train state; a trainer jitted with the state donated
(`jax.jit(update, donate_argnums=0)`) writes it in place instead of copying it every update.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ReplayState:
    """data: pytree of [capacity, ...] arrays. position: [] int32 next write slot.
    size: [] int32 number of filled slots (≤ capacity)."""

    data: Any
    position: jax.Array
    size: jax.Array


class ReplayBuffer:
    """Fixed-capacity FIFO ring of transitions (pytrees with a leading batch axis)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"replay capacity must be ≥ 1, got {capacity}")
        self.capacity = capacity

    def init(self, example: Any) -> ReplayState:
        """Empty buffer for transitions shaped like `example` (one transition, no batch axis)."""
        data = jax.tree.map(
            lambda x: jnp.zeros((self.capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example
        )
        return ReplayState(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

    def insert(self, state: ReplayState, batch: Any) -> ReplayState:
        """Writes `batch` ([n, ...] leaves, n ≤ capacity) at the write position, wrapping around
        and overwriting the oldest transitions."""
        n = jax.tree.leaves(batch)[0].shape[0]
        if n > self.capacity:
            raise ValueError(f"batch of {n} transitions exceeds the capacity {self.capacity}")
        idx = (state.position + jnp.arange(n)) % self.capacity
        data = jax.tree.map(lambda d, b: d.at[idx].set(b), state.data, batch)
        return ReplayState(
            data,
            (state.position + n) % self.capacity,
            jnp.minimum(state.size + n, self.capacity),
        )

    def sample(self, state: ReplayState, key: jax.Array, batch_size: int) -> Any:
        """`batch_size` transitions drawn uniformly with replacement from the filled slots
        (slot 0, zeros, while the buffer is empty)."""
        idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1))
        return jax.tree.map(lambda d: d[idx], state.data)
