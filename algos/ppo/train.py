"""PPO over batched JAX envs with an asymmetric actor-critic (purejaxrl-style, fully jittable).

`make_train(cfg, env, episode_length)` returns a `Trainer` of pure functions:
  init(key) -> TrainState;  update(ts) -> (ts, metrics);  train(key) -> (ts, metrics [U])
`update` is one rollout + `update_epochs` passes of minibatch SGD; `train` scans it and can be
vmapped over seeds. The curriculum hook is `env_state.info["progress"]` = update / num_updates,
written before each rollout. Truncated episodes bootstrap with γ·V(s_t) (rsl_rl's time-out rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from algos.ppo.config import PPOConfig
from algos.ppo.losses import compute_gae, ppo_loss
from policies import (
    ActorCritic,
    gaussian_entropy,
    gaussian_log_prob,
    make_actor_critic,
    update_normalizer,
)
from sim import Env, State, wrap_for_training


@struct.dataclass
class TrainState:
    """params: actor-critic params. opt_state: optax state. env_state: batched env state.
    key: PRNG key. update: [] int32 number of completed updates."""

    params: Any
    opt_state: Any
    env_state: State
    key: jax.Array
    update: jax.Array


class Trainer(NamedTuple):
    init: Callable[[jax.Array], TrainState]
    update: Callable[[TrainState], tuple[TrainState, dict]]
    train: Callable[[jax.Array], tuple[TrainState, dict]]
    network: ActorCritic
    env: Env


class Transition(NamedTuple):
    obs: jax.Array
    critic_obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array


def make_network(cfg: PPOConfig, env: Env) -> ActorCritic:
    sizes = env.observation_size
    critic_key = "privileged_state" if cfg.network.asymmetric else "state"
    return make_actor_critic(
        cfg.network,
        sizes["state"][0],
        sizes[critic_key][0],
        env.action_size,
        action_bias=env.default_action,
    )


def make_train(cfg: PPOConfig, env: Env, episode_length: int) -> Trainer:
    """`env` is unbatched (domain randomization included); batching happens here."""
    cfg.validate()
    benv = wrap_for_training(env, episode_length)
    ac = make_network(cfg, env)
    critic_key = "privileged_state" if cfg.network.asymmetric else "state"
    n_updates = cfg.num_updates
    n_steps_per_lr = n_updates * cfg.update_epochs * cfg.num_minibatches
    schedule = optax.linear_schedule(
        cfg.learning_rate, cfg.learning_rate * cfg.lr_final_fraction, n_steps_per_lr
    )
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(schedule, eps=1e-5))

    def init(key: jax.Array) -> TrainState:
        key, key_params, key_env = jax.random.split(key, 3)
        params = ac.init(key_params)
        env_state = benv.reset(jax.random.split(key_env, cfg.num_envs))
        params = _update_norms(params, env_state.obs["state"], env_state.obs[critic_key])
        return TrainState(
            params, tx.init(_trainable(params)), env_state, key, jnp.zeros((), jnp.int32)
        )

    def _update_norms(params, obs, cobs):
        return {
            **params,
            "obs_norm": update_normalizer(params["obs_norm"], obs),
            "critic_norm": update_normalizer(params["critic_norm"], cobs),
        }

    def rollout(params, env_state, key):
        def step(carry, _):
            env_state, key = carry
            key, key_act = jax.random.split(key)
            obs, cobs = env_state.obs["state"], env_state.obs[critic_key]
            mean, log_std = ac.actor(params, obs)
            action = mean + jnp.exp(log_std) * jax.random.normal(key_act, mean.shape)
            value = ac.critic(params, cobs)
            nstate = benv.step(env_state, action)
            reward = nstate.reward * cfg.reward_scale
            reward = reward + cfg.gamma * value * nstate.info["truncation"]
            tr = Transition(
                obs,
                cobs,
                action,
                gaussian_log_prob(mean, log_std, action),
                value,
                reward,
                nstate.done,
            )
            return (nstate, key), (tr, nstate)

        (env_state, _), (traj, states) = jax.lax.scan(
            step, (env_state, key), None, cfg.unroll_length
        )
        return env_state, traj, states

    def loss_fn(trainable, norms, mb: Transition, adv, ret):
        params = {**trainable, **norms}
        mean, log_std = ac.actor(params, mb.obs)
        value = ac.critic(params, mb.critic_obs)
        logp = gaussian_log_prob(mean, log_std, mb.action)
        return ppo_loss(
            logp,
            mb.log_prob,
            adv,
            value,
            ret,
            gaussian_entropy(log_std),
            cfg.clip_eps,
            cfg.vf_coef,
            cfg.ent_coef,
        )

    def sgd(params, opt_state, key, traj: Transition, adv, ret):
        data = (traj, adv, ret)
        data = jax.tree.map(lambda x: x.reshape((cfg.batch_size, *x.shape[2:])), data)

        def epoch(carry, key_perm):
            params, opt_state = carry
            perm = jax.random.permutation(key_perm, cfg.batch_size)
            mbs = jax.tree.map(
                lambda x: x[perm].reshape((cfg.num_minibatches, -1, *x.shape[1:])), data
            )

            def minibatch(carry, mb):
                params, opt_state = carry
                trainable = _trainable(params)
                norms = {k: params[k] for k in params if k not in trainable}
                grads, metrics = jax.grad(loss_fn, has_aux=True)(trainable, norms, *mb)
                updates, opt_state = tx.update(grads, opt_state, trainable)
                return ({**params, **optax.apply_updates(trainable, updates)}, opt_state), metrics

            return jax.lax.scan(minibatch, (params, opt_state), mbs)

        (params, opt_state), metrics = jax.lax.scan(
            epoch, (params, opt_state), jax.random.split(key, cfg.update_epochs)
        )
        return params, opt_state, jax.tree.map(jnp.mean, metrics)

    def update(ts: TrainState) -> tuple[TrainState, dict]:
        key, key_roll, key_sgd = jax.random.split(ts.key, 3)
        progress = ts.update.astype(jnp.float32) / n_updates
        env_state = ts.env_state.replace(
            info={**ts.env_state.info, "progress": jnp.full((cfg.num_envs,), progress)}
        )
        env_state, traj, states = rollout(ts.params, env_state, key_roll)
        last_value = ac.critic(ts.params, env_state.obs[critic_key])
        adv, ret = compute_gae(
            traj.reward, traj.value, traj.done, last_value, cfg.gamma, cfg.gae_lambda
        )
        params, opt_state, metrics = sgd(ts.params, ts.opt_state, key_sgd, traj, adv, ret)
        params = _update_norms(params, traj.obs, traj.critic_obs)
        metrics.update(_rollout_metrics(states))
        metrics["progress"] = progress
        ts = TrainState(params, opt_state, env_state, key, ts.update + 1)
        return ts, metrics

    def train(key: jax.Array) -> tuple[TrainState, dict]:
        return jax.lax.scan(lambda ts, _: update(ts), init(key), None, n_updates)

    return Trainer(init, update, train, ac, env)


def _trainable(params: dict) -> dict:
    """The optimized part of the params (normalizer statistics are updated from data instead)."""
    return {k: v for k, v in params.items() if not k.endswith("_norm")}


def _rollout_metrics(states: State) -> dict[str, jax.Array]:
    """Means over the rollout [T, B]; episode statistics over episodes that finished in it."""
    info = states.info
    ended = info["episode_done"]
    n = jnp.maximum(ended.sum(), 1.0)
    out = {k: v.mean() for k, v in states.metrics.items()}
    out["reward"] = states.reward.mean()
    out["episode/return"] = jnp.sum(info["last_return"] * ended) / n
    out["episode/length"] = jnp.sum(info["last_length"] * ended) / n
    out["episode/count"] = ended.sum()
    out["episode/termination_rate"] = jnp.sum(ended * (1 - info["truncation"])) / n
    return out
