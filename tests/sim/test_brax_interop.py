"""brax's training wrappers and PPO trainer over our envs (STYLE.md §2, §10).

What the installed versions allow (brax 0.14.2, jax 0.10.2):
- works: `VmapWrapper` (with and without `batch_size`), `EpisodeWrapper` over it, brax's
  `EpisodeWrapper` under our `VmapWrapper`/`AutoResetWrapper`, and brax's PPO trainer with that
  stack once `jax.device_put_replicated` is shimmed (test marked slow).
- fails, upstream: brax's PPO calls `jax.device_put_replicated`, removed in jax 0.10.
- fails, our contract: brax's `AutoResetWrapper` (hence `envs.training.wrap` and the PPO default
  wrapping) reads `state.pipeline_state`, brax's field name; our `State` uses Playground's `data`.
- fails, our bug: `EvalWrapper` (used by brax's evaluator) adds `metrics["reward"]`, which
  `QuadrotorEnv.step` drops because it rebuilds `metrics` instead of updating it.
brax wants raw `uint32[..., 2]` keys (`rng.shape[:-1]` is its batch shape).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sim

pytest.importorskip("brax")
from brax.envs.wrappers import training as bw  # noqa: E402

B = 4


@pytest.fixture(scope="module")
def env():
    return sim.make_env("quadrotor-hover")


def raw_keys(seed: int, n: int = B) -> jax.Array:
    return jax.random.split(jax.random.PRNGKey(seed), n)


def test_brax_vmap_wrapper_matches_ours(env):
    keys = raw_keys(0)
    actions = jnp.tile(env.default_action, (B, 1)) + 0.1
    ours = sim.VmapWrapper(env)
    theirs = bw.VmapWrapper(env)
    a = ours.step(ours.reset(keys), actions)
    b = theirs.step(theirs.reset(keys), actions)
    for x, y in zip(
        jax.tree.leaves((a.data, a.obs, a.reward, a.done, a.metrics)),
        jax.tree.leaves((b.data, b.obs, b.reward, b.done, b.metrics)),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)
    c = bw.VmapWrapper(env, batch_size=B).reset(jax.random.PRNGKey(1))
    assert c.obs["state"].shape == (B, *env.observation_size["state"])
    assert theirs.observation_size == env.observation_size and theirs.action_size == 4


def test_brax_episode_wrapper(env):
    wrapped = bw.EpisodeWrapper(bw.VmapWrapper(env), episode_length=3, action_repeat=1)
    s = wrapped.reset(raw_keys(2))
    assert s.info["steps"].shape == (B,)
    rewards = []
    for t in range(1, 4):
        s = wrapped.step(s, jnp.tile(env.default_action, (B, 1)))
        rewards.append(np.asarray(s.reward))
        np.testing.assert_array_equal(s.info["steps"], t)
    ended = np.asarray(s.done) == 1
    assert ended.all()
    np.testing.assert_array_equal(np.asarray(s.info["truncation"]), 1.0)
    np.testing.assert_allclose(
        s.info["episode_metrics"]["sum_reward"], np.sum(rewards, 0), rtol=1e-6
    )
    assert {"position_error", "reward/alive"} <= set(s.info["episode_metrics"])


def test_brax_episode_wrapper_under_our_auto_reset(env):
    """The stack used to run brax's PPO: our AutoReset/Vmap around brax's EpisodeWrapper."""
    wrapped = sim.AutoResetWrapper(sim.VmapWrapper(bw.EpisodeWrapper(env, 2, 1)))
    s = wrapped.reset(raw_keys(3))
    first = np.asarray(s.obs["state"][:, :3])
    step = jnp.tile(env.default_action, (B, 1))
    s = wrapped.step(wrapped.step(s, step), step)
    np.testing.assert_array_equal(s.done, 1.0)
    np.testing.assert_array_equal(s.info["steps"], 0.0)  # fresh episodes
    assert np.abs(np.asarray(s.obs["state"][:, :3]) - first).max() > 1e-3


def test_brax_eval_wrapper(env):
    wrapped = bw.EvalWrapper(bw.EpisodeWrapper(bw.VmapWrapper(env), 3, 1))
    s = wrapped.reset(raw_keys(4))
    for _ in range(4):
        s = wrapped.step(s, jnp.tile(env.default_action, (B, 1)))
    np.testing.assert_array_equal(s.info["eval_metrics"].episode_steps, 3)


@pytest.mark.xfail(
    strict=True,
    raises=AttributeError,
    reason=(
        "brax AutoResetWrapper reads state.pipeline_state; sim.env.State names that field `data` "
        "(MuJoCo Playground's name, which ships its own auto-reset wrapper)"
    ),
)
def test_brax_auto_reset_wrapper(env):
    wrapped = bw.wrap(env, episode_length=2)
    s = wrapped.reset(raw_keys(5))
    wrapped.step(s, jnp.tile(env.default_action, (B, 1)))


def test_brax_ppo_needs_device_put_replicated():
    """Pins the upstream incompatibility that the slow test below works around."""
    from brax.training.agents.ppo import train as brax_ppo

    assert "jax.device_put_replicated" in inspect.getsource(brax_ppo)
    with pytest.raises(AttributeError, match="device_put_replicated"):
        jax.device_put_replicated  # noqa: B018


@pytest.mark.slow
def test_brax_ppo_trains_on_our_env(env, monkeypatch):
    from brax.training.agents.ppo import train as brax_ppo

    def device_put_replicated(x, devices):
        return jax.device_put(jax.tree.map(lambda a: jnp.stack([a] * len(devices)), x), devices[0])

    monkeypatch.setattr(jax, "device_put_replicated", device_put_replicated, raising=False)

    def wrap_env_fn(e, episode_length=10, action_repeat=1, **_):
        return sim.AutoResetWrapper(
            sim.VmapWrapper(bw.EpisodeWrapper(e, episode_length, action_repeat))
        )

    make_policy, params, metrics = brax_ppo.train(
        environment=env,
        wrap_env_fn=wrap_env_fn,
        num_timesteps=512,
        episode_length=10,
        num_envs=8,
        batch_size=8,
        num_minibatches=2,
        unroll_length=4,
        num_evals=0,
        seed=0,
    )
    policy = make_policy(params, deterministic=True)
    obs = env.reset(jax.random.PRNGKey(0)).obs
    action, _ = policy(jax.tree.map(lambda x: x[None], obs), jax.random.PRNGKey(1))
    assert action.shape == (1, 4) and bool(jnp.all(jnp.isfinite(action)))
