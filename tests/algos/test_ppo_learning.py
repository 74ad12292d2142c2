"""PPO learning test: the default recipe with a 64-64 critic, cut to ~1.5 minutes of CPU, must
learn to stay airborne longer under the full eval protocol (randomized dynamics, disturbances,
wide starts).

The untrained policy (the hover command) terminates in ~100 % of episodes after ~80 steps. With
this 4 M-step budget, calibration runs of this test's loop (seeds 0 and 1) ended with training
episodes of 313 and 240 steps and eval flights of 321 and 314 steps alive; the thresholds (1.5×
longer eval flights, training episodes > 150 steps) fail for a learner that does not learn.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest

from algos import get_preset
from algos.evaluate import rollout, summarize
from algos.ppo import make_train
from policies import make_policy
from sim import make_env

TIMESTEPS = 4_000_000


@pytest.mark.slow
def test_ppo_learns_to_hover():
    cfg = get_preset("quadrotor-hover", "cpu", "ppo")
    net = dataclasses.replace(cfg.ppo.network, critic_hidden=(64, 64))
    ppo = dataclasses.replace(cfg.ppo, total_timesteps=TIMESTEPS, network=net)
    cfg = dataclasses.replace(cfg, ppo=ppo)
    env = make_env(cfg.task, cfg.env, cfg.randomization)
    trainer = make_train(cfg.ppo, env, cfg.env.episode_steps)
    update = jax.jit(trainer.update, donate_argnums=0)
    ts = jax.jit(trainer.init)(jax.random.key(0))

    @jax.jit
    def episodes(params):
        policy = make_policy(trainer.network, params, deterministic=True)
        return rollout(env, policy, jax.random.key(1), 500, 500)

    def evaluate(params):
        traj = episodes(params)
        steps_alive = float((1.0 - traj["done"]).sum(0).mean())
        return {**summarize(traj, 200, 0.1), "steps_alive": steps_alive}

    before = evaluate(ts.params)
    for _ in range(cfg.ppo.num_updates):
        ts, metrics = update(ts)
    after = evaluate(ts.params)
    assert before["termination_rate"] > 0.95 and before["steps_alive"] < 150, before
    assert after["steps_alive"] > 1.5 * before["steps_alive"], (before, after)
    assert float(metrics["episode/length"]) > 150
