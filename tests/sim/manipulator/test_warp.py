"""The arm envs on MJX's Warp implementation (`scene.impl="warp"`, Warp's CPU backend here): same
physics as the JAX implementation, a contact pool shared by the batch that the batching wrappers
leave alone, overflow reporting, and the error without warp-lang."""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.evaluate import rollout
from algos.presets import get_preset
from algos.run_folder import make_train_env, run_batch
from sim import make_env
from sim.manipulator import HOME, ArmConfig, SceneConfig
from sim.manipulator._mjx import warp_overflow
from sim.wrappers import VmapWrapper, wrap_for_training

pytest.importorskip("warp", reason="the Warp tests need warp-lang (pip install hoverfly[warp])")

B = 4


def _env(impl: str, action_space: str = "joint_delta", **scene):
    cfg = ArmConfig(
        task="pick_place", action_space=action_space, scene=SceneConfig(impl=impl, **scene)
    )
    return make_env("arm-pick-place", cfg)  # with domain randomization


def test_warp_matches_jax_with_randomization():
    """20 control steps (80 physics steps) of random Cartesian actions (the IK runs Warp's
    kinematics) on 4 randomized envs (the cube resting on the table, plane–box contacts):
    positions agree to float32 rounding."""
    keys = jax.random.split(jax.random.key(3), B)
    actions = jax.random.uniform(jax.random.key(4), (20, B, 4), minval=-1, maxval=1)
    out = {}
    for impl in ("jax", "warp"):
        env = VmapWrapper(_env(impl, "cartesian", warp_envs=B))

        def run(keys, env=env):
            s = env.reset(keys)
            return jax.lax.scan(lambda s, a: (env.step(s, a), None), s, actions)[0]

        out[impl] = jax.jit(run, compiler_options=env.compiler_options)(keys)
    jx, wp = out["jax"].data.physics, out["warp"].data.physics
    assert float(jnp.abs(jx.qpos - wp.qpos).max()) < 1e-4
    np.testing.assert_allclose(out["warp"].reward, out["jax"].reward, atol=1e-3)
    assert not np.any(warp_overflow(wp))
    assert float(jnp.abs(jx.qpos[:, :7] - jnp.asarray(HOME)).max()) > 0.05  # the arms moved


def test_warp_pool_survives_auto_reset_and_eval_freeze():
    """Episodes of 3 steps under the training wrappers (auto-reset scatters fresh envs into the
    batch) and the eval rollout (frozen finished envs): the pool keeps its shape, no batch axis."""
    env = wrap_for_training(_env("warp", warp_envs=B), 3)
    s = env.reset(jax.random.split(jax.random.key(0), B))
    pool = s.data.physics._impl.contact__pos.shape
    assert pool == (B * SceneConfig().warp_contacts, 3)
    a = jnp.zeros((B, env.action_size))
    step = jax.jit(env.step, compiler_options=env.compiler_options)
    for _ in range(7):
        s = step(s, a)
    assert s.data.physics._impl.contact__pos.shape == pool
    np.testing.assert_array_equal(s.info["steps"], 1)  # reset after steps 3 and 6
    np.testing.assert_array_equal(s.data.step, 1)
    assert np.all(np.isfinite(np.asarray(s.data.physics.qpos)))

    def policy(obs, key):
        return jnp.zeros((obs.shape[0], 8)), {}

    traj = rollout(_env("warp", warp_envs=B), policy, jax.random.key(1), B, 5)
    assert traj["success"].shape == (5, B) and np.all(np.isfinite(np.asarray(traj["position"])))


def test_pool_overflow_is_reported():
    """8 envs stepped with a pool for 1 env of 2 contacts: contacts are dropped, and flagged."""
    env = VmapWrapper(_env("warp", warp_envs=1, warp_contacts=2))
    s = env.reset(jax.random.split(jax.random.key(0), 8))
    s = jax.jit(env.step)(s, jnp.zeros((8, env.action_size)))
    assert np.any(warp_overflow(s.data.physics))


def test_trainer_sizes_the_pool_for_the_run():
    cfg = get_preset("arm-pick-place", "cpu")
    scene = dataclasses.replace(cfg.arm.scene, impl="warp")
    cfg = dataclasses.replace(cfg, arm=dataclasses.replace(cfg.arm, scene=scene))
    env = make_train_env(cfg)
    assert env.unwrapped.config.scene.warp_envs == run_batch(cfg) == cfg.ppo.num_envs
    assert make_train_env(cfg, batch=1000).unwrapped.config.scene.warp_envs == 1000


def test_missing_warp_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="warp_envs"):
        _env("warp")
    monkeypatch.setitem(sys.modules, "warp", None)  # `import warp` raises ImportError
    with pytest.raises(ValueError, match="needs NVIDIA Warp"):
        _env("warp", warp_envs=B)
