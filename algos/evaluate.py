"""Closed-loop evaluation of a policy on an unbatched env (vmapped over episodes), and its plot."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from algos.presets import EvalConfig
from algos.run_folder import atomic_write
from sim import Env, ObservationSubset
from sim.wrappers import batch_where


def rollout(
    env: Env,
    policy_fn: Callable,
    key: jax.Array,
    episodes: int,
    steps: int,
    record_obs: bool = False,
) -> dict[str, jax.Array]:
    """Runs `episodes` episodes of `steps` steps without auto-reset.

    policy_fn(obs [B, obs], key) -> (action [B, A], extras). Returns per-step arrays [T, B]:
    `position_error` (m), `done` (1 from the termination step on), `position` [T, B, 3] (the
    env's `tracked_position`), and `success` for envs whose metrics have a success flag (arms);
    with `record_obs`, also `obs` [T, B, obs] (what the policy saw) and `action` [T, B, A].
    Only the actor's observation is computed (`ObservationSubset`).
    """
    env = ObservationSubset(env)
    key_reset, key_run = jax.random.split(key)
    state = jax.vmap(env.reset)(jax.random.split(key_reset, episodes))

    def step(carry, key_step):
        state, dead = carry
        action, _ = policy_fn(state.obs["state"], key_step)
        nstate = jax.vmap(env.step)(state, action)
        # Freeze terminated episodes so that non-finite states do not propagate.
        dead = jnp.maximum(dead, nstate.done)
        nstate = batch_where(carry[1] <= 0, nstate, state)
        out = {
            "position_error": nstate.metrics["position_error"],
            "done": dead,
            "position": jax.vmap(env.unwrapped.tracked_position)(nstate.data),
        }
        if "success" in nstate.metrics:
            out["success"] = nstate.metrics["success"]
        if record_obs:
            out |= {"obs": state.obs["state"], "action": action}
        return (nstate, dead), out

    _, traj = jax.lax.scan(step, (state, jnp.zeros(episodes)), jax.random.split(key_run, steps))
    return traj


def episode_success(traj: dict[str, jax.Array], settle_steps: int, tolerance: float) -> jax.Array:
    """[B] bool, jittable: never terminated, and the env's success flag at the last step where
    it has one (arms), else the mean position error over the last `settle_steps` steps is
    ≤ `tolerance`."""
    if "success" in traj:
        reached = traj["success"][-1] > 0
    else:
        reached = traj["position_error"][-settle_steps:].mean(0) <= tolerance
    return (traj["done"][-1] <= 0) & reached


def summarize(traj: dict[str, jax.Array], settle_steps: int, tolerance: float) -> dict[str, float]:
    """Success as `episode_success`; RMSE over alive steps only. Returns the four keys of
    eval.json's summary."""
    keys = ("position_error", "done", "success")
    success, terminated, rmse = _summary_arrays(
        {k: traj[k] for k in keys if k in traj}, settle_steps, tolerance
    )
    return {
        "success_rate": float(np.mean(np.asarray(success))),  # float64: 0.895, not 0.89500004
        "pos_rmse_m": float(rmse),
        "termination_rate": float(np.mean(np.asarray(terminated))),
        "episodes": int(traj["done"].shape[1]),
    }


@functools.partial(jax.jit, static_argnums=(1, 2))
def _summary_arrays(traj: dict[str, jax.Array], settle_steps: int, tolerance: float):
    """`summarize`'s arrays in one program (op by op, its first call compiled a dozen programs
    in ~0.45 s, inside the training clock at the first validation)."""
    err, dead = traj["position_error"], traj["done"]
    alive = 1.0 - dead
    rmse = jnp.sqrt(jnp.sum(err**2 * alive) / jnp.maximum(alive.sum(), 1.0))
    return episode_success(traj, settle_steps, tolerance), dead[-1] > 0, rmse


def eval_steps(cfg: EvalConfig, dt: float) -> tuple[int, int]:
    """(episode steps, settle-window steps) of the evaluation protocol at control period `dt`."""
    return max(1, round(cfg.seconds / dt)), max(1, round(cfg.settle_seconds / dt))


def plot_trajectories(
    traj: dict[str, np.ndarray],
    dt: float,
    tolerance: float,
    settle_steps: int,
    path: Path,
    max_episodes: int = 20,
) -> None:
    """PNG of sample episodes: position error vs time, xy and xz paths (terminated ones in red).

    traj: host arrays from `rollout` ([T, B] and [T, B, 3]); the first `max_episodes` are drawn.
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    err = np.asarray(traj["position_error"])[:, :max_episodes]
    pos = np.asarray(traj["position"])[:, :max_episodes]
    dead = np.asarray(traj["done"])[:, :max_episodes] > 0
    steps, n = err.shape
    t = np.arange(1, steps + 1) * dt
    fig = Figure(figsize=(14, 4.5), layout="constrained")
    ax_err, ax_xy, ax_xz = fig.subplots(1, 3)
    for i in range(n):
        alive = ~dead[:, i]
        color = "tab:red" if dead[-1, i] else "tab:blue"
        ax_err.plot(t[alive], err[alive, i], color=color, lw=0.8, alpha=0.7)
        ax_xy.plot(pos[alive, i, 0], pos[alive, i, 1], color=color, lw=0.8, alpha=0.7)
        ax_xz.plot(pos[alive, i, 0], pos[alive, i, 2], color=color, lw=0.8, alpha=0.7)
        for ax, j in ((ax_xy, 1), (ax_xz, 2)):
            ax.plot(pos[0, i, 0], pos[0, i, j], "o", color=color, ms=3)
    ax_err.axhline(tolerance, color="k", ls="--", lw=0.8, label=f"tolerance {tolerance} m")
    ax_err.axvspan(t[-1] - settle_steps * dt, t[-1], color="0.9", label="settle window")
    ax_err.set(
        xlabel="time [s]",
        ylabel="position error [m]",
        yscale="log",
        title=f"{n} episodes (red: terminated)",
    )
    ax_err.legend(loc="upper right")
    for ax, name in ((ax_xy, "y"), (ax_xz, "z")):
        ax.plot(0, 0, "k+", ms=12)
        ax.set(xlabel="x [m]", ylabel=f"{name} [m]", aspect="equal", title=f"x{name} path")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    atomic_write(path, buf.getvalue())
