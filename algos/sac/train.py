"""Soft Actor-Critic over batched JAX envs: replay buffer on the device, automatic entropy tuning,
twin critics with Polyak targets, an asymmetric critic option (Haarnoja et al. 2018).

`make_train(cfg, env, episode_length)` returns a `Trainer` of pure functions with PPO's shapes:
  init(key) -> TrainState;  update(ts) -> (ts, metrics);  train(key) -> (ts, metrics [U])
One `update` collects `unroll_length` steps from each of `num_envs` envs with the stochastic
policy, stores them in the replay buffer, updates the observation normalizers, then takes
`cfg.grad_steps` gradient steps (critic, actor, temperature, target) once the buffer holds
`learning_starts` transitions. Jit `update` with the state donated (`donate_argnums=0`) so that the
buffer is written in place. The curriculum hook `env_state.info["progress"]` = update / num_updates
is written before each rollout, as in PPO.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from algos.ppo.train import _rollout_metrics
from algos.sac.config import SACConfig
from algos.sac.losses import actor_loss, alpha_loss, critic_loss, critic_target, polyak_update
from algos.sac.replay import ReplayBuffer, ReplayState
from policies import update_normalizer
from policies.sac import SACNetworks, make_sac_networks, sample_squashed
from sim import Env, State, wrap_for_training


@struct.dataclass
class TrainState:
    """params: SAC params (`policies.sac`, targets and temperature included). opt_state: optax
    states {"actor", "critic", "alpha"}. env_state: batched env state. replay: the buffer.
    key: PRNG key. update: [] int32 number of completed updates."""

    params: Any
    opt_state: Any
    env_state: State
    replay: ReplayState
    key: jax.Array
    update: jax.Array


class Trainer(NamedTuple):
    init: Callable[[jax.Array], TrainState]
    update: Callable[[TrainState], tuple[TrainState, dict]]
    train: Callable[[jax.Array], tuple[TrainState, dict]]
    network: SACNetworks
    env: Env


def make_network(cfg: SACConfig, env: Env) -> SACNetworks:
    sizes = env.observation_size
    return make_sac_networks(
        cfg.network,
        sizes["state"][0],
        sizes[_critic_key(cfg)][0],
        env.action_size,
        action_bias=env.default_action,
        init_alpha=cfg.init_alpha,
    )


def _critic_key(cfg: SACConfig) -> str:
    return "privileged_state" if cfg.network.asymmetric else "state"


def _actor_params(params: dict) -> dict:
    return {"actor": params["actor"], "log_std": params["log_std"]}


def make_train(cfg: SACConfig, env: Env, episode_length: int) -> Trainer:
    """`env` is unbatched (domain randomization included); batching happens here."""
    cfg.validate()
    benv = wrap_for_training(env, episode_length)
    net = make_network(cfg, env)
    buffer = ReplayBuffer(cfg.buffer_size)
    ckey = _critic_key(cfg)
    target_entropy = -cfg.target_entropy_scale * env.action_size
    n_updates = cfg.num_updates

    def adam(lr):
        return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr))

    tx_actor, tx_critic, tx_alpha = adam(cfg.actor_lr), adam(cfg.critic_lr), adam(cfg.alpha_lr)

    def update_norms(params, obs, cobs):
        return {
            **params,
            "obs_norm": update_normalizer(params["obs_norm"], obs),
            "critic_norm": update_normalizer(params["critic_norm"], cobs),
        }

    def init(key: jax.Array) -> TrainState:
        key, key_params, key_env = jax.random.split(key, 3)
        params = net.init(key_params)
        env_state = benv.reset(jax.random.split(key_env, cfg.num_envs))
        obs, cobs = env_state.obs["state"], env_state.obs[ckey]
        params = update_norms(params, obs, cobs)
        one = jnp.zeros(())
        example = _transition(obs[0], cobs[0], jnp.zeros(env.action_size), one, obs[0], cobs[0])
        opt_state = {
            "actor": tx_actor.init(_actor_params(params)),
            "critic": tx_critic.init(params["critic"]),
            "alpha": tx_alpha.init(params["log_alpha"]),
        }
        replay = buffer.init(example)
        return TrainState(params, opt_state, env_state, replay, key, jnp.zeros((), jnp.int32))

    def collect(params, env_state, key):
        def step(carry, _):
            env_state, key = carry
            key, key_act = jax.random.split(key)
            obs, cobs = env_state.obs["state"], env_state.obs[ckey]
            action, _ = sample_squashed(*net.actor(params, obs), key_act)
            ns = benv.step(env_state, action)
            trunc = ns.info["truncation"]
            tr = _transition(
                obs,
                cobs,
                action,
                ns.reward * cfg.reward_scale,
                ns.obs["state"],
                ns.obs[ckey],
                done=ns.done * (1.0 - trunc),  # termination only
                mask=1.0 - trunc,  # the successor of a time-out was replaced by the auto-reset
            )
            return (ns, key), (tr, ns)

        (env_state, _), (trs, states) = jax.lax.scan(
            step, (env_state, key), None, cfg.unroll_length
        )
        return env_state, trs, states

    def grad_step(replay: ReplayState, carry, key):
        params, opt_state = carry
        key_sample, key_next, key_pi = jax.random.split(key, 3)
        b = buffer.sample(replay, key_sample, cfg.batch_size)
        alpha = jnp.exp(params["log_alpha"])
        norm = params["critic_norm"]
        next_a, next_logp = sample_squashed(*net.actor(params, b["next_obs"]), key_next)
        next_q = net.critic(params["target_critic"], norm, b["next_critic_obs"], next_a)
        y = critic_target(b["reward"], b["done"], next_q, next_logp, alpha, cfg.gamma)

        def c_loss(critic):
            q = net.critic(critic, norm, b["critic_obs"], b["action"])
            return critic_loss(q, y, b["mask"]), q

        (lc, q), grads = jax.value_and_grad(c_loss, has_aux=True)(params["critic"])
        upd, opt_critic = tx_critic.update(grads, opt_state["critic"], params["critic"])
        critic = optax.apply_updates(params["critic"], upd)

        def a_loss(actor):
            a, logp = sample_squashed(*net.actor({**params, **actor}, b["obs"]), key_pi)
            return actor_loss(net.critic(critic, norm, b["critic_obs"], a), logp, alpha), logp

        actor = _actor_params(params)
        (la, logp), grads = jax.value_and_grad(a_loss, has_aux=True)(actor)
        upd, opt_actor = tx_actor.update(grads, opt_state["actor"], actor)
        actor = optax.apply_updates(actor, upd)
        lal, grad = jax.value_and_grad(alpha_loss)(params["log_alpha"], logp, target_entropy)
        upd, opt_alpha = tx_alpha.update(grad, opt_state["alpha"], params["log_alpha"])
        params = {
            **params,
            **actor,
            "critic": critic,
            "target_critic": polyak_update(critic, params["target_critic"], cfg.tau),
            "log_alpha": optax.apply_updates(params["log_alpha"], upd),
        }
        opt_state = {"actor": opt_actor, "critic": opt_critic, "alpha": opt_alpha}
        metrics = {
            "loss/critic": lc,
            "loss/actor": la,
            "loss/alpha": lal,
            "alpha": alpha,
            "entropy": -logp.mean(),
            "q": q.mean(),
        }
        return (params, opt_state), metrics

    def learn(replay, carry, key):
        def body(carry, key):
            return grad_step(replay, carry, key)

        carry, metrics = jax.lax.scan(body, carry, jax.random.split(key, cfg.grad_steps))
        return carry, jax.tree.map(jnp.mean, metrics)

    def update(ts: TrainState) -> tuple[TrainState, dict]:
        key, key_roll, key_grad = jax.random.split(ts.key, 3)
        progress = ts.update.astype(jnp.float32) / n_updates
        env_state = ts.env_state.replace(
            info={**ts.env_state.info, "progress": jnp.full((cfg.num_envs,), progress)}
        )
        env_state, trs, states = collect(ts.params, env_state, key_roll)
        flat = jax.tree.map(lambda x: x.reshape((cfg.steps_per_update, *x.shape[2:])), trs)
        replay = buffer.insert(ts.replay, flat)
        params = update_norms(ts.params, trs["obs"], trs["critic_obs"])
        carry = (params, ts.opt_state)
        shapes = jax.eval_shape(learn, replay, carry, key_grad)[1]
        (params, opt_state), metrics = jax.lax.cond(
            replay.size >= cfg.learning_starts,
            lambda c: learn(replay, c, key_grad),
            lambda c: (c, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)),
            carry,
        )
        metrics.update(_rollout_metrics(states))
        metrics["progress"] = progress
        metrics["replay_size"] = replay.size.astype(jnp.float32)
        return TrainState(params, opt_state, env_state, replay, key, ts.update + 1), metrics

    def train(key: jax.Array) -> tuple[TrainState, dict]:
        return jax.lax.scan(lambda ts, _: update(ts), init(key), None, n_updates)

    return Trainer(init, update, train, net, env)


def _transition(obs, critic_obs, action, reward, next_obs, next_critic_obs, done=0.0, mask=1.0):
    """One transition (or a batch): reward already scaled; done: termination (no bootstrap);
    mask: 0 for time-outs, left out of the critic loss."""
    f = jnp.float32
    return {
        "obs": obs,
        "critic_obs": critic_obs,
        "action": action,
        "reward": jnp.asarray(reward, f),
        "next_obs": next_obs,
        "next_critic_obs": next_critic_obs,
        "done": jnp.asarray(done, f),
        "mask": jnp.asarray(mask, f),
    }
