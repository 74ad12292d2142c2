"""The residual wrapper: action composition and clipping, the scale schedule, observation
augmentation statistics, the base's carry across steps and auto-resets, bases from a callable and
from a run folder, and PPO training on the wrapped env."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.ppo import PPOConfig, make_train
from algos.residual import (
    ObsAugmentation,
    ResidualScale,
    ResidualWrapper,
    base_from_callable,
    base_from_run,
    field_layout,
    residual_scale,
)
from algos.residual.base import BasePolicy
from algos.run_folder import load_run
from policies import NetworkConfig, make_policy
from sim import wrap_for_training
from sim.quadrotor import OBS_FIELDS, QuadrotorEnv
from sim.quadrotor.controller import ControllerConfig, make_controller

LAYOUT = field_layout(OBS_FIELDS)
BASE_ACTION = jnp.array([0.5, -0.5, 0.9, -0.95])


@pytest.fixture(scope="module")
def quiet_env(quiet_config):
    return QuadrotorEnv(quiet_config)


def constant_base():
    return base_from_callable(lambda obs: BASE_ACTION)


def test_field_layout_matches_the_quadrotor_observation():
    assert LAYOUT["position_error"] == (0, 3)
    assert LAYOUT["rotation_matrix"] == (3, 12)
    assert LAYOUT["angular_velocity"] == (15, 18)


def test_action_composition_and_clipping(quiet_env):
    env = ResidualWrapper(quiet_env, constant_base(), ResidualScale(start=0.2, end=0.2))
    assert env.action_size == 4 and np.array_equal(env.default_action, jnp.zeros(4))
    n = quiet_env.observation_size
    assert env.observation_size["state"] == (n["state"][0] + 4,)
    assert env.observation_size["privileged_state"] == (n["privileged_state"][0] + 4,)
    s = env.reset(jax.random.key(0))
    np.testing.assert_array_equal(s.obs["state"][-4:], BASE_ACTION)
    residual = jnp.array([1.0, -3.0, 1.0, -1.0])  # −3 is clipped to −1 before scaling
    s = env.step(s, residual)
    applied = s.data.actions[0]  # the env's action history records what it applied
    want = np.clip(np.asarray(BASE_ACTION) + 0.2 * np.clip(residual, -1, 1), -1, 1)
    np.testing.assert_allclose(applied, want, rtol=1e-6)
    assert float(applied[2]) == 1.0 and float(applied[3]) == -1.0  # clipped to the range
    np.testing.assert_allclose(
        s.metrics["residual/correction"], np.mean(np.abs(want - BASE_ACTION))
    )


def test_zero_residual_is_the_base_alone(quiet_env):
    """With a zero residual the wrapped env applies the controller's command, and the controller's
    integrators advance as in a plain closed loop (noise-free env: observations agree)."""
    ctrl = make_controller(ControllerConfig(), quiet_env.dt)
    env = ResidualWrapper(quiet_env, ctrl)
    s, cs = env.reset(jax.random.key(1)), ctrl.init()
    raw = quiet_env.reset(jax.random.key(1))
    for _ in range(3):
        a, cs = ctrl.apply(raw.obs["state"], cs)
        raw = quiet_env.step(raw, a)
        s = env.step(s, jnp.zeros(4))
        np.testing.assert_allclose(s.data.actions[0], a, atol=1e-6)
    np.testing.assert_allclose(s.info["base_state"].pos_integral, cs.pos_integral, atol=1e-7)


def test_scale_schedule(quiet_env):
    cfg = ResidualScale(start=0.1, end=0.5, ramp=0.5)
    got = residual_scale(cfg, jnp.array([0.0, 0.25, 0.5, 1.0]))
    np.testing.assert_allclose(got, [0.1, 0.3, 0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(residual_scale(ResidualScale(0.1, 0.4), jnp.zeros(2)), [0.4, 0.4])
    env = ResidualWrapper(quiet_env, constant_base(), cfg)
    s = env.reset(jax.random.key(0))
    s = s.replace(info={**s.info, "progress": jnp.asarray(0.25)})  # as PPO writes it
    s = env.step(s, jnp.full(4, 0.5))
    assert float(s.metrics["residual/scale"]) == pytest.approx(0.3)
    np.testing.assert_allclose(s.data.actions[0, :2], BASE_ACTION[:2] + 0.15, rtol=1e-6)
    with pytest.raises(ValueError, match="ramp"):
        ResidualWrapper(quiet_env, constant_base(), ResidualScale(ramp=2.0))


def test_augmentation_noise_statistics(quiet_env):
    """σ on the named field only, for the views that are targeted; the critic stays clean."""
    aug = ObsAugmentation(fields=("position_error",), noise_std=0.05, targets=("residual",))
    probe = base_from_callable(lambda obs: jnp.tanh(obs[:4]))
    env = ResidualWrapper(quiet_env, probe, augmentation=aug, layout=LAYOUT)
    s = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(3), 4000))
    clean = s.info["inner_obs"]["state"]
    diff = np.asarray(s.obs["state"][:, :-4] - clean)
    std = diff[:, :3].std(0)
    assert np.all(np.abs(std - 0.05) < 0.05 * 0.06), std  # 4000 samples: σ within ±6 %
    assert np.abs(diff[:, :3].mean(0)).max() < 0.005
    assert np.all(diff[:, 3:] == 0)
    # The base is not a target: it saw the clean observation.
    np.testing.assert_allclose(s.obs["state"][:, -4:], jnp.tanh(clean[:, :4]), atol=1e-6)
    np.testing.assert_array_equal(
        s.obs["privileged_state"][:, :-4], s.info["inner_obs"]["privileged_state"]
    )


def test_augmentation_dropout_holds_the_last_value(quiet_env):
    aug = ObsAugmentation(fields=("position_error", "velocity_error"), dropout_prob=0.3)
    env = ResidualWrapper(quiet_env, constant_base(), augmentation=aug, layout=LAYOUT)
    n, steps = 512, 20

    def episode(key):
        s = env.reset(key)

        def body(s, _):
            ns = env.step(s, jnp.zeros(4))
            return ns, (s.obs["state"], ns.obs["state"], ns.info["inner_obs"]["state"])

        return jax.lax.scan(body, s, None, steps)[1]

    prev, cur, clean = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(4), n))
    for start, stop in (LAYOUT["position_error"], LAYOUT["velocity_error"]):
        held = np.all(cur[..., start:stop] == prev[..., start:stop], -1)
        fresh = np.all(cur[..., start:stop] == clean[..., start:stop], -1)
        assert np.all(held | fresh)  # each field is either the env's value or the held one
        rate = (held & ~fresh).mean()
        assert abs(rate - 0.3) < 0.02, rate  # 10240 draws: ±0.02 is > 4σ
    # Fields outside the augmentation are always fresh.
    np.testing.assert_array_equal(cur[..., 3:12], clean[..., 3:12])


def test_augmentation_rejects_unknown_fields(quiet_env):
    aug = ObsAugmentation(fields=("object_pose",), noise_std=0.01)
    with pytest.raises(ValueError, match="object_pose"):
        ResidualWrapper(quiet_env, constant_base(), augmentation=aug, layout=LAYOUT)


def counter_base():
    """Counts its calls in its carry; action zeros."""
    return BasePolicy(lambda: jnp.zeros((), jnp.int32), lambda obs, c: (jnp.zeros(4), c + 1))


def test_base_state_carried_and_reset_with_the_episode(quiet_env):
    """Under `sim.wrap_for_training` (3-step episodes) the carry counts steps and starts over at
    every auto-reset (reset runs the base once for the first action)."""
    env = wrap_for_training(ResidualWrapper(quiet_env, counter_base()), episode_length=3)
    s = env.reset(jax.random.split(jax.random.key(0), 2))
    step = jax.jit(env.step)
    counts = [s.info["base_state"].tolist()]
    for _ in range(7):
        s = step(s, jnp.zeros((2, 4)))
        counts.append(s.info["base_state"].tolist())
    assert counts == [[1, 1], [2, 2], [3, 3], [1, 1], [2, 2], [3, 3], [1, 1], [2, 2]]


def test_base_from_run_matches_the_checkpoint_policy(hover_run, quiet_env):
    run = load_run(hover_run)
    base = base_from_run(run)
    policy = make_policy(run.network, run.params, deterministic=True)
    obs = run.env.reset(jax.random.key(5)).obs["state"]
    action, carry = base.apply(obs, base.init())
    np.testing.assert_allclose(action, policy(obs, jax.random.key(0))[0], rtol=1e-6)
    env = ResidualWrapper(run.env, base)
    assert env.observation_size["state"] == (run.env.observation_size["state"][0] + 4,)
    small = QuadrotorEnv(dataclasses.replace(quiet_env.config, action_history=2))
    with pytest.raises(ValueError, match="expects"):
        ResidualWrapper(small, base)


def test_ppo_trains_on_the_wrapped_env(quiet_env):
    """PPO's `make_train` runs unchanged: the actor starts at "no correction" and a few updates
    change the params and keep every metric finite."""
    env = ResidualWrapper(quiet_env, make_controller(ControllerConfig(), quiet_env.dt))
    net = NetworkConfig(actor_hidden=(16,), critic_hidden=(16,))
    cfg = PPOConfig(
        total_timesteps=3 * 16 * 8, num_envs=16, unroll_length=8, num_minibatches=2, network=net
    )
    trainer = make_train(cfg, env, episode_length=50)
    ts = jax.jit(trainer.init)(jax.random.key(0))
    mean, _ = trainer.network.actor(ts.params, ts.env_state.obs["state"])
    assert float(jnp.abs(mean).max()) < 0.1  # output head starts near zero: no correction
    params0 = ts.params
    update = jax.jit(trainer.update)
    for _ in range(cfg.num_updates):
        ts, metrics = update(ts)
    assert int(ts.update) == 3
    assert all(bool(jnp.isfinite(v)) for v in metrics.values()), metrics
    assert float(metrics["residual/scale"]) == pytest.approx(0.3, rel=1e-5)
    moved = jax.tree.map(lambda a, b: jnp.any(a != b), params0["actor"], ts.params["actor"])
    assert any(jax.tree.leaves(moved))
