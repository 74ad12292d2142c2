"""Closed-loop evaluation of a policy on an unbatched env (vmapped over episodes)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from sim import Env


def rollout(
    env: Env, policy_fn: Callable, key: jax.Array, episodes: int, steps: int
) -> dict[str, jax.Array]:
    """Runs `episodes` episodes of `steps` steps without auto-reset.

    policy_fn(obs [B, obs], key) -> (action [B, A], extras). Returns per-step arrays [T, B]:
    `position_error` (m), `done` (1 from the termination step on), `position` [T, B, 3].
    """
    key_reset, key_run = jax.random.split(key)
    state = jax.vmap(env.reset)(jax.random.split(key_reset, episodes))

    def step(carry, key_step):
        state, dead = carry
        action, _ = policy_fn(state.obs["state"], key_step)
        nstate = jax.vmap(env.step)(state, action)
        # Freeze terminated episodes so that non-finite states do not propagate.
        dead = jnp.maximum(dead, nstate.done)
        nstate = jax.tree.map(
            lambda a, b: jnp.where(jnp.reshape(carry[1] > 0, (-1,) + (1,) * (a.ndim - 1)), b, a),
            nstate, state)
        out = {"position_error": nstate.metrics["position_error"], "done": dead,
               "position": jnp.stack(nstate.data.rigid.pos, -1)}
        return (nstate, dead), out

    _, traj = jax.lax.scan(step, (state, jnp.zeros(episodes)), jax.random.split(key_run, steps))
    return traj


def summarize(traj: dict[str, jax.Array], settle_steps: int, tolerance: float) -> dict[str, float]:
    """Success: never terminated and mean position error over the last `settle_steps` ≤ tolerance."""
    err, dead = traj["position_error"], traj["done"]
    terminated = dead[-1] > 0
    final_err = err[-settle_steps:].mean(0)
    success = (~terminated) & (final_err <= tolerance)
    alive = 1.0 - dead
    rmse = jnp.sqrt(jnp.sum(err**2 * alive) / jnp.maximum(alive.sum(), 1.0))
    return {
        "success_rate": float(success.mean()),
        "pos_rmse_m": float(rmse),
        "termination_rate": float(terminated.mean()),
        "episodes": int(err.shape[1]),
    }
