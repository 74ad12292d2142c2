"""Domain randomization of the arm scene: parameter ranges, model write-through, noise placement."""

import jax
import numpy as np

from sim.manipulator import (
    ArmConfig,
    ArmEnv,
    DomainRandomization,
    RandomizationConfig,
    obs_fields,
    randomize_params,
)


def test_params_within_ranges_and_written_into_model():
    env = ArmEnv(ArmConfig(task="push"))
    cfg = RandomizationConfig()
    p0 = env.nominal_params
    ps = jax.vmap(lambda k: randomize_params(k, p0, cfg))(jax.random.split(jax.random.key(0), 256))
    for name, r in (("cube_half_size", cfg.cube_size), ("cube_mass", cfg.cube_mass),
                    ("cube_friction", cfg.cube_friction), ("gain_scale", cfg.gains)):  # fmt: skip
        ratio = np.asarray(getattr(ps, name)) / np.asarray(getattr(p0, name))
        assert ratio.min() >= 1 - r and ratio.max() <= 1 + r and ratio.std() > r / 4, name
    p = jax.tree.map(lambda x: x[0], ps)
    m = env.model(p)
    ix = env.index
    np.testing.assert_allclose(m.geom_size[ix.cube_geom], [p.cube_half_size] * 3, rtol=1e-6)
    np.testing.assert_allclose(m.body_mass[ix.cube_body], p.cube_mass, rtol=1e-6)
    np.testing.assert_allclose(m.geom_friction[ix.cube_geom, 0], p.cube_friction, rtol=1e-6)
    kp = env.mjx_model.actuator_gainprm[ix.arm_act, 0]
    np.testing.assert_allclose(m.actuator_gainprm[ix.arm_act, 0], kp * p.gain_scale, rtol=1e-6)
    np.testing.assert_allclose(m.actuator_biasprm[ix.arm_act, 1], -kp * p.gain_scale, rtol=1e-6)


def test_reset_noise_only_on_actor_positions():
    base = ArmEnv(ArmConfig(task="push"))
    env = DomainRandomization(base, RandomizationConfig())
    s = jax.jit(env.reset, compiler_options=env.compiler_options)(jax.random.key(1))
    p = s.data.params
    assert float(p.cube_half_size) != float(base.nominal_params.cube_half_size)
    # the cube rests on the table at its randomized size
    np.testing.assert_allclose(s.data.physics.qpos[base.index.cube_qpos + 2], p.cube_half_size)
    n = base.observation_size["state"][0]
    diff = np.asarray(s.obs["state"] - s.obs["privileged_state"][:n])  # privileged is clean
    start = 0
    for name, size in obs_fields(base.action_size):
        noisy = name in ("joint_pos", "cube_pos", "cube_minus_tcp", "goal_minus_cube")
        assert np.all(diff[start : start + size] != 0) == noisy, name
        start += size
