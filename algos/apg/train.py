"""Analytic policy gradients: backpropagation through the differentiable JAX simulator.

Each update runs `horizon` steps of `num_envs` envs with the deterministic actor (plus optional
reparameterized noise) and takes one Adam step on −mean reward, differentiated through the
dynamics, the observations and the actor (truncated BPTT, as brax's APG and SHAC without its
critic). The actor's weight gradients are formed after the window's backward loop, one product per
layer over all steps, from the cotangents of zero taps on its layers' outputs
(`ActorCritic.actor_taps`). Episodes continue across updates (the last state is carried, gradients
stop there). An env whose episode ends inside the window is frozen at its last state, marked
`done`, and reset at the start of the next update (resetting inside the window costs a while loop
per step: 1.7× the update time and 3× the compilation on the CPU). `init` builds placeholder
states, all marked `done`, so the first update draws the initial states: the reset is compiled
once, inside the update, not also in `init` (~1.5 s less compilation before the first update on the
CPU). The terminal reward is a constant and carries no gradient: termination is avoided through the
shaped terms before it.

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
from policies import mlp_tap_grads, update_normalizer
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
        key, key_params = jax.random.split(key)
        params = ac.init(key_params)
        return TrainState(
            params,
            tx.init(params["actor"]),
            _placeholders(inner, cfg.num_envs),
            key,
            jnp.zeros((), jnp.int32),
        )

    widths = (*cfg.network.actor_hidden, env.action_size)

    def window_loss(taps: list[jax.Array], params, state: State, key: jax.Array):
        """−mean reward of the window. The actor's weights enter stopped and its Dense layers'
        outputs through `taps` (zeros [H, B, width]); also returns the layers' inputs."""
        params = {**params, "actor": stop(params["actor"])}

        def step(carry, xs):
            (s, alive), (key_step, tap) = carry, xs
            action, inputs = ac.actor_taps(params, s.obs["state"], tap)
            if cfg.action_noise:  # not drawn at 0 (XLA keeps a draw times 0.0: 860 HLO ops)
                action = action + cfg.action_noise * jax.random.normal(key_step, action.shape)
            ns = inner.step(s, action)
            live = alive * (1.0 - ns.done)
            nxt = jax.tree.map(lambda new, old: _where(live > 0, new, stop(old)), ns, s)
            obs = s.obs["state"]
            window = Window(ns.reward, ns.metrics, ns.info["truncation"], ns.done, alive, obs)
            return (nxt, live), (window, inputs)

        (last, _), (window, inputs) = jax.lax.scan(
            step,
            (state, jnp.ones(cfg.num_envs)),
            (jax.random.split(key, cfg.horizon), taps),
            unroll=cfg.unroll,
        )
        return -jnp.mean(_alive_rewards(window)), (stop(last), stop(window), inputs)

    def loss_and_grads(params, state: State, key: jax.Array):
        """The window's loss and its gradient for the actor's weights. The backward loop yields
        each step's cotangent g of every layer's output (the taps'); a layer's kernel gradient is
        then Σ_t x_tᵀ g_t over the window, one product after the loop instead of one per step
        inside it (CPU update 14.3 → 11.9 ms, README "What bounds the update")."""
        taps = [jnp.zeros((cfg.horizon, cfg.num_envs, w)) for w in widths]
        loss, vjp, (last, window, inputs) = jax.vjp(
            lambda t: window_loss(t, params, state, key), taps, has_aux=True
        )
        (cotangents,) = vjp(jnp.ones_like(loss))
        return loss, last, window, mlp_tap_grads(inputs, cotangents)

    def update(ts: TrainState) -> tuple[TrainState, dict]:
        key, key_roll, key_reset = jax.random.split(ts.key, 3)
        env_state = _reset_done(inner, ts.env_state, key_reset)
        # The first update's fresh states start the observation statistics.
        norm = ts.params["obs_norm"]
        first = update_normalizer(norm, env_state.obs["state"])
        norm = jax.tree.map(lambda a, b: jnp.where(ts.update == 0, a, b), first, norm)
        ts = ts.replace(params={**ts.params, "obs_norm": norm})
        progress = ts.update.astype(jnp.float32) / n_updates
        env_state = env_state.replace(
            info={**env_state.info, "progress": jnp.full((cfg.num_envs,), progress)}
        )
        loss, last, window, grads = loss_and_grads(ts.params, env_state, key_roll)
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
        env_state, metrics = _end_window(last, window)
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


def _placeholders(inner: Env, n: int) -> State:
    """`n` all-zero states of `inner.reset`'s structure (traced, not run), all marked `done`."""

    def zeros(leaf):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return jax.random.split(jax.random.key(0), leaf.shape)
        return jnp.zeros(leaf.shape, leaf.dtype)

    like = jax.eval_shape(
        lambda k: _with_episode_info(inner.reset(k)), jax.random.split(jax.random.key(0), n)
    )
    return jax.tree.map(zeros, like).replace(done=jnp.ones((n,)))


def _reset_done(inner: Env, state: State, key: jax.Array) -> State:
    """Fresh episodes (new keys from `key`) for the envs marked `done`."""
    n = state.done.shape[0]
    fresh = _with_episode_info(inner.reset(jax.random.split(key, n)))
    return jax.tree.map(lambda f, o: _where(state.done > 0, f, o), fresh, state)


def _where(cond: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """`jnp.where` with `cond` [B] broadcast over the trailing axes of `a` [B, ...]."""
    return jnp.where(jnp.reshape(cond, (-1,) + (1,) * (a.ndim - 1)), a, b)


def _alive_rewards(w: Window) -> jax.Array:
    """[H, B] rewards of the steps taken while alive (0 after an episode's end)."""
    return jnp.where(w.alive > 0, w.reward, 0.0)


def _end_window(last: State, w: Window) -> tuple[State, dict]:
    """Marks the envs whose episode ended in the window `done` (the next update resets them);
    metrics as PPO's `_rollout_metrics` (means over the steps alive, episode statistics over the
    episodes that ended)."""
    alive = w.alive
    ended_at = alive * w.done  # [H, B]: 1 on an episode's last step
    ended = ended_at.sum(0)
    rewards = _alive_rewards(w)
    ret = last.info["episode_return"] + rewards.sum(0)
    length = last.info["episode_length"] + alive.sum(0)
    info = {
        **last.info,
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
    return last.replace(done=(ended > 0).astype(jnp.float32), info=info), out
