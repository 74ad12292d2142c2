"""Analytic policy gradients: backpropagation through the differentiable JAX simulator.

Each update runs `horizon` steps of `num_envs` envs with the deterministic actor (plus optional
reparameterized noise) and takes one Adam step on −mean reward, differentiated through the
dynamics, the observations and the actor (truncated BPTT, as brax's APG and SHAC without its
critic). Episodes continue across updates (the last state is carried, gradients stop there). An
env whose episode ends inside the window is frozen at its last state until the window ends and
then reset (resetting inside the window costs a while loop per step: 1.7× the update time and 3×
the compilation on the CPU). The terminal reward is a constant and carries no gradient:
termination is avoided through the shaped terms before it.

`make_train(cfg, env, episode_length)` returns the same `Trainer` as PPO's (init, update, train,
network, env); the network is PPO's actor-critic, so evaluation and export treat both alike.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from algos.apg.config import APGConfig
from algos.ppo.train import Trainer, TrainState, make_network
from policies import update_normalizer
from sim import Env, EpisodeWrapper, State, VmapWrapper


def make_train(cfg: APGConfig, env: Env, episode_length: int) -> Trainer:
    """`env` is unbatched (domain randomization included) and differentiable; batching here."""
    cfg.validate()
    inner = VmapWrapper(EpisodeWrapper(env, episode_length))
    ac = make_network(cfg, env)
    n_updates = cfg.num_updates
    schedule = optax.linear_schedule(
        cfg.learning_rate, cfg.learning_rate * cfg.lr_final_fraction, n_updates
    )
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(schedule))
    stop = jax.lax.stop_gradient

    def init(key: jax.Array) -> TrainState:
        key, key_params, key_env = jax.random.split(key, 3)
        params = ac.init(key_params)
        env_state = _with_episode_info(inner.reset(jax.random.split(key_env, cfg.num_envs)))
        params["obs_norm"] = update_normalizer(params["obs_norm"], env_state.obs["state"])
        return TrainState(
            params, tx.init(params["actor"]), env_state, key, jnp.zeros((), jnp.int32)
        )

    def loss_fn(actor, params, state: State, key: jax.Array):
        params = {**params, "actor": actor}

        def step(carry, key_step):
            s, alive = carry
            mean, _ = ac.actor(params, s.obs["state"])
            action = mean + cfg.action_noise * jax.random.normal(key_step, mean.shape)
            ns = inner.step(s, action)
            live = alive * (1.0 - ns.done)
            nxt = jax.tree.map(lambda new, old: _where(live > 0, new, stop(old)), ns, s)
            obs = s.obs["state"]
            return (nxt, live), Window(
                ns.reward, ns.metrics, ns.info["truncation"], ns.done, alive, obs
            )

        (last, _), window = jax.lax.scan(
            step,
            (state, jnp.ones(cfg.num_envs)),
            jax.random.split(key, cfg.horizon),
        )
        return -jnp.mean(_alive_rewards(window)), (stop(last), stop(window))

    def update(ts: TrainState) -> tuple[TrainState, dict]:
        key, key_roll, key_reset = jax.random.split(ts.key, 3)
        progress = ts.update.astype(jnp.float32) / n_updates
        env_state = ts.env_state.replace(
            info={**ts.env_state.info, "progress": jnp.full((cfg.num_envs,), progress)}
        )
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, (last, window)), grads = grad_fn(ts.params["actor"], ts.params, env_state, key_roll)
        # A window that reached a non-finite state gives non-finite gradients: skip it (by hand:
        # optax.apply_if_finite gives other float bits, and the committed runs would not reproduce).
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        updates, opt_state = tx.update(
            jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads), ts.opt_state
        )
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        opt_state = jax.tree.map(keep, opt_state, ts.opt_state)
        params = {
            **ts.params,
            "actor": jax.tree.map(lambda p, u: keep(p + u, p), ts.params["actor"], updates),
            "obs_norm": update_normalizer(ts.params["obs_norm"], window.obs),
        }
        env_state, metrics = _end_window(inner, last, window, key_reset)
        metrics.update(
            loss=loss,
            grad_norm=optax.global_norm(grads),
            skipped=1.0 - finite.astype(jnp.float32),
            progress=progress,
        )
        return TrainState(params, opt_state, env_state, key, ts.update + 1), metrics

    def train(key: jax.Array) -> tuple[TrainState, dict]:
        return jax.lax.scan(lambda ts, _: update(ts), init(key), None, n_updates)

    return Trainer(init, update, train, ac, env)


class Window(NamedTuple):
    """Per-step records [H, B] of one update's window."""

    reward: jax.Array
    metrics: dict[str, jax.Array]
    truncation: jax.Array
    done: jax.Array
    alive: jax.Array
    """1 while the episode that was running at the window's start goes on (before the step)."""
    obs: jax.Array
    """The actor observations the actions were computed from, [H, B, obs]."""


_EPISODE_INFO = ("episode_return", "episode_length")


def _with_episode_info(state: State) -> State:
    z = jnp.zeros_like(state.done)
    return state.replace(info={**state.info, **dict.fromkeys(_EPISODE_INFO, z)})


def _where(cond: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """`jnp.where` with `cond` [B] broadcast over the trailing axes of `a` [B, ...]."""
    return jnp.where(jnp.reshape(cond, (-1,) + (1,) * (a.ndim - 1)), a, b)


def _alive_rewards(w: Window) -> jax.Array:
    """[H, B] rewards of the steps taken while alive (0 after an episode's end)."""
    return jnp.where(w.alive > 0, w.reward, 0.0)


def _end_window(inner: Env, last: State, w: Window, key: jax.Array) -> tuple[State, dict]:
    """Resets the envs whose episode ended in the window; metrics as PPO's `_rollout_metrics`
    (means over the steps alive, episode statistics over the episodes that ended)."""
    alive = w.alive
    ended_at = alive * w.done  # [H, B]: 1 on an episode's last step
    ended = ended_at.sum(0)
    rewards = _alive_rewards(w)
    ret = last.info["episode_return"] + rewards.sum(0)
    length = last.info["episode_length"] + alive.sum(0)
    fresh = inner.reset(jax.random.split(key, ended.shape[0]))
    fresh_info = {**fresh.info, "progress": last.info["progress"]}
    state = jax.tree.map(
        lambda f, o: _where(ended > 0, f, o),
        fresh.replace(info=fresh_info),
        last.replace(info={k: last.info[k] for k in fresh_info}),
    )
    info = {
        **state.info,
        "episode_return": jnp.where(ended > 0, 0.0, ret),
        "episode_length": jnp.where(ended > 0, 0.0, length),
    }
    n_alive, count = jnp.maximum(alive.sum(), 1.0), jnp.maximum(ended.sum(), 1.0)
    out = {k: jnp.sum(v * alive) / n_alive for k, v in w.metrics.items()}
    out["reward"] = rewards.sum() / n_alive
    out["episode/return"] = jnp.sum(ret * ended) / count
    out["episode/length"] = jnp.sum(length * ended) / count
    out["episode/count"] = ended.sum()
    out["episode/termination_rate"] = jnp.sum(ended_at * (1.0 - w.truncation)) / count
    return state.replace(info=info), out
