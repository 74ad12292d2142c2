"""Arm env contract, reward terms and success flags, model-file errors (real MJX)."""

import dataclasses

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from sim import make_env
from sim.manipulator import HOME, ArmConfig, ArmEnv, SceneConfig
from sim.manipulator._mjx import mjx
from sim.wrappers import VmapWrapper

B = 64  # batch of the contract test; the MJX-vs-C test reuses its compiled step


@pytest.fixture(scope="module")
def pick_env():
    return ArmEnv(ArmConfig(task="pick_place"))


@pytest.fixture(scope="module")
def batched(pick_env):
    """(reset, step) of the vmapped pick-place env, jitted once for the module."""
    env = VmapWrapper(pick_env)
    opts = env.compiler_options
    return jax.jit(env.reset, compiler_options=opts), jax.jit(env.step, compiler_options=opts)


def test_goal_targets_are_drawn_uniformly():
    targets = ((0.6, 0.1, 0.05), (0.4, -0.1, 0.15))
    init = dataclasses.replace(ArmConfig().init, goal_targets=targets)
    env = ArmEnv(ArmConfig(task="pick_place", init=init))
    keys = jax.random.split(jax.random.key(0), 256)
    goals = np.asarray(jax.jit(jax.vmap(lambda k: env._sample_goal(k, jnp.float32(0.02))))(keys))
    first = np.all(np.abs(goals - (0.6, 0.1, 0.07)) < 1e-6, axis=1)
    second = np.all(np.abs(goals - (0.4, -0.1, 0.17)) < 1e-6, axis=1)
    assert np.all(first | second) and 0.35 < first.mean() < 0.65
    bad = dataclasses.replace(init, goal_targets=((0.5, 0.0),))
    with pytest.raises(ValueError, match="goal_targets"):
        ArmEnv(ArmConfig(task="pick_place", init=bad))


def test_contract_vmap_determinism(pick_env, batched):
    reset, step = batched
    keys = jax.random.split(jax.random.key(0), B)
    s = reset(keys)
    s2 = reset(keys)
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(s2), strict=True):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b)
    assert s.obs["state"].shape == (B, *pick_env.observation_size["state"])
    assert s.obs["privileged_state"].shape == (B, *pick_env.observation_size["privileged_state"])
    cubes = s.data.physics.qpos[:, pick_env.index.cube_qpos]
    assert np.unique(np.asarray(cubes)).size == B  # keys give different initial states
    act = jax.random.uniform(jax.random.key(1), (B, pick_env.action_size), minval=-1, maxval=1)
    for _ in range(3):
        s = step(s, act)
    for leaf in (s.obs["state"], s.obs["privileged_state"], s.reward, s.done):
        assert np.all(np.isfinite(leaf))
    assert set(s.metrics) >= {"success", "reward/reach", "reward/lift", "reward/goal"}
    total = sum(v for k, v in s.metrics.items() if k.startswith("reward/"))
    np.testing.assert_allclose(total, s.reward, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def initial(pick_env, batched):
    """One initial state (env 0 of a batched reset), shared by the reward tests."""
    s = batched[0](jax.random.split(jax.random.key(3), B))
    return jax.tree.map(lambda x: x[0], s)


def _place_cube(env, state, pos):
    """Sets the cube position (the rewards read it from qpos), the tool having reached it."""
    px = state.data.physics
    q = px.qpos.at[env.index.cube_qpos : env.index.cube_qpos + 3].set(pos)
    return state.data.replace(physics=px.replace(qpos=q), reached=jnp.ones(()))


@pytest.mark.parametrize("task", ["push", "pick_place"])
def test_cube_at_goal_is_success(task, initial):
    env = ArmEnv(ArmConfig(task=task))  # same scene and state layout; only the task differs
    goal = initial.data.goal
    at_goal = _place_cube(env, initial, goal)
    away = _place_cube(env, initial, goal + jnp.array([0.1, 0.0, 0.0]))
    t_goal, d_goal, ok = env._reward(at_goal, at_goal.last_action)
    t_away, d_away, ko = env._reward(away, away.last_action)
    assert float(ok) == 1.0 and float(ko) == 0.0
    assert float(d_goal) < 1e-6 and abs(float(d_away) - 0.1) < 1e-5
    assert t_goal["goal"] > t_away["goal"]
    assert t_goal["success"] == env.config.reward.success


def test_reach_success_and_shaping(initial):
    env = ArmEnv(ArmConfig(task="reach"))
    tcp = initial.data.physics.site_xpos[env.index.ee_site]
    near = env._reward(initial.data.replace(goal=tcp + 0.01), initial.data.last_action)
    far = env._reward(initial.data.replace(goal=tcp + 0.1), initial.data.last_action)
    assert float(near[2]) == 1.0 and float(far[2]) == 0.0
    assert near[0]["reach"] > far[0]["reach"]


def test_reach_has_no_contacts_and_a_parked_cube(pick_env):
    """arm-reach turns contacts off (nothing to touch); the damped cube stays where it is parked
    (C MuJoCo on the same compiled model, 1 s with the arm swinging)."""
    env = ArmEnv(ArmConfig(task="reach"))
    off = mujoco.mjtDisableBit.mjDSBL_CONTACT
    assert env.mj_model.opt.disableflags & off and not pick_env.mj_model.opt.disableflags & off
    m, ix = env.mj_model, env.index
    d = mujoco.MjData(m)
    d.qpos[ix.arm_qpos] = HOME
    d.qpos[ix.cube_qpos : ix.cube_qpos + 3] = (-0.5, 0.0, 0.02)
    start = d.qpos[ix.cube_qpos : ix.cube_qpos + 3].copy()
    for t in range(200):
        d.ctrl[ix.arm_act] = np.asarray(HOME) + 0.5 * np.sin(0.05 * t)
        mujoco.mj_step(m, d)
    assert np.abs(d.qpos[ix.cube_qpos : ix.cube_qpos + 3] - start).max() < 1e-4
    assert np.abs(d.qpos[ix.arm_qpos] - np.asarray(HOME)).max() > 0.1  # the arm did move


def test_lift_term_grows_with_height(pick_env, initial):
    h = float(initial.data.params.cube_half_size)
    lifts = []
    for z in (h, h + 0.02, h + 0.2):
        data = _place_cube(pick_env, initial, jnp.array([0.5, 0.0, z]))
        lifts.append(float(pick_env._reward(data, data.last_action)[0]["lift"]))
    assert lifts[0] == 0.0 and 0 < lifts[1] < lifts[2] == pick_env.config.reward.lift


def test_grasp_term_pays_a_closed_gripper_at_the_cube(pick_env, initial):
    tcp = initial.data.physics.site_xpos[pick_env.index.ee_site]
    grasps = {}
    for where, pos in {"at": tcp + 0.01, "away": tcp + jnp.array([0.0, 0.0, -0.1])}.items():
        data = _place_cube(pick_env, initial, pos)
        for grip in (1.0, 0.0, -1.0):  # open, half, closed
            action = data.last_action.at[-1].set(grip)
            grasps[where, grip] = float(
                pick_env._reward(data.replace(last_action=action), action)[0]["grasp"]
            )
    full = pick_env.config.reward.grasp
    assert (
        grasps["at", 1.0] == 0.0 and grasps["at", 0.0] == 0.5 * full and grasps["at", -1.0] == full
    )
    assert all(grasps["away", g] == 0.0 for g in (1.0, 0.0, -1.0))


def test_model_file_errors(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        ArmEnv(ArmConfig(scene=SceneConfig(model_path=str(tmp_path / "nope.xml"))))
    bad = tmp_path / "arm.xml"
    bad.write_text(
        '<mujoco><worldbody><body name="b"><joint name="joint1"/><geom size="0.1"/>'
        '<site name="tcp"/></body></worldbody></mujoco>'
    )
    with pytest.raises(ValueError, match="'joint2' is missing.*'finger_joint1' is missing"):
        ArmEnv(ArmConfig(scene=SceneConfig(model_path=str(bad))))
    broken = tmp_path / "broken.xml"
    broken.write_text("<mujoco><worldbody>")
    with pytest.raises(ValueError, match="cannot load robot model"):
        ArmEnv(ArmConfig(scene=SceneConfig(model_path=str(broken))))


def test_arm_joints_must_move_the_tool():
    with pytest.raises(ValueError, match="arm joint 'joint1' does not move site 'goal'"):
        ArmEnv(ArmConfig(scene=SceneConfig(ee_site="goal")))


def test_ik_jacobian_matches_autodiff(pick_env):
    """The analytic Jacobian's damped-least-squares step equals the one from forward-mode
    autodiff of the same pose error through MJX kinematics, at random joint configurations."""
    s = pick_env.reset(jax.random.key(3))
    mx, px, ix = pick_env.model(s.data.params), s.data.physics, pick_env.index

    def pose_error(q):
        kin = mjx.kinematics(mx, px.replace(qpos=px.qpos.at[ix.arm_qpos].set(q)))
        rot = kin.site_xmat[ix.ee_site]
        rot_err = 0.5 * jnp.sum(jnp.cross(rot.T, pick_env.home_rotation.T), axis=0)
        return jnp.concatenate([kin.site_xpos[ix.ee_site], rot_err])

    # One jitted jvp per joint: `jax.jacfwd` (the jvp vmapped over the 7 joints) takes XLA:CPU
    # 73 s to compile and 24 s op by op, the jvp 9 s.
    column = jax.jit(lambda q, v: jax.jvp(pose_error, (q,), (v,)))
    ik_step = jax.jit(pick_env._ik_step)
    lam2 = pick_env.config.ik_damping**2
    for seed in range(3):
        q = px.qpos[ix.arm_qpos] + 0.3 * jax.random.normal(jax.random.key(seed), (7,))
        dpos = jnp.array([0.01, -0.005, 0.003])
        columns = [column(q, v) for v in jnp.eye(7)]  # (pose error, its derivative) each
        jac = jnp.stack([d for _, d in columns], axis=1)
        err = jnp.concatenate([dpos, -columns[0][0][3:]])
        ref = jac.T @ jnp.linalg.solve(jac @ jac.T + lam2 * jnp.eye(6), err)
        np.testing.assert_allclose(ik_step(mx, px, q, dpos), ref, atol=1e-5)
        assert float(jnp.abs(ref).max()) > 0.1


def test_user_model_path_loads_the_same_robot():
    from sim.manipulator.model import PANDA_XML

    cfg = ArmConfig(task="reach", scene=SceneConfig(model_path=str(PANDA_XML)))
    env = make_env("arm-reach", cfg, randomization=None)
    assert env.unwrapped.config == dataclasses.replace(cfg, task="reach")
    assert env.observation_size == ArmEnv(ArmConfig(task="reach")).observation_size


def test_max_contact_points_bounds_mjx_contacts(pick_env, tmp_path):
    """MJX keeps the 12 deepest of its 24 candidate contacts (the solver's rows shrink from 105 to
    57); None keeps all; a user MJCF that sets the numeric itself gets the scene's value."""
    from sim.manipulator.model import PANDA_XML

    assert mjx.make_data(pick_env.mjx_model)._impl.ncon == 12
    every = ArmEnv(ArmConfig(task="pick_place", scene=SceneConfig(max_contact_points=None)))
    assert mjx.make_data(every.mjx_model)._impl.ncon == 24
    own = tmp_path / "panda.xml"
    numeric = '<custom><numeric name="max_contact_points" data="3"/></custom>'
    own.write_text(PANDA_XML.read_text().replace("<worldbody>", numeric + "<worldbody>", 1))
    scene = SceneConfig(model_path=str(own), max_contact_points=16)
    own_env = ArmEnv(ArmConfig(task="pick_place", scene=scene))
    assert mjx.make_data(own_env.mjx_model)._impl.ncon == 16


def test_mjx_matches_c_mujoco(pick_env, batched):
    """The same controls on MJX (float32, batched) and C MuJoCo (`mj_step`, float64), 200 control
    steps (800 physics steps) of smooth random joint-target motion with the gripper opening and
    closing; the cube rests on the table (plane–box contacts active throughout).

    Tolerances: the arm is held by stiff position servos, so float32 rounding does not grow along
    the trajectory (observed ≤ 2e-6 rad; bound 1e-4 rad). The cube starts exactly touching the
    table; the first contact step differs by ~4e-4 m between the two collision codes and then
    agrees to ~5e-6 m (bound 1e-3 m on its position, 1e-4 m after the first 10 steps)."""
    reset, step = batched
    m = pick_env.mj_model
    s = reset(jax.random.split(jax.random.key(7), B))
    envs = (0, 1)
    datas = []
    for i in envs:  # C data from what `mjx.step` reads (the reset ran kinematics, not forward)
        d = mujoco.MjData(m)
        for name in ("qpos", "qvel", "qacc_warmstart"):
            getattr(d, name)[:] = np.asarray(getattr(s.data.physics, name)[i])
        datas.append(d)
    rng = np.random.default_rng(0)
    action = np.zeros((B, pick_env.action_size), np.float32)
    worst_arm = worst_cube = worst_cube_late = 0.0
    ix = pick_env.index
    for t in range(200):
        action = np.clip(0.9 * action + 0.3 * rng.normal(size=action.shape), -1, 1)
        action[:, -1] = 1.0 if (t // 50) % 2 == 0 else -1.0
        s = step(s, jnp.asarray(action, jnp.float32))
        for i, d in zip(envs, datas, strict=True):
            d.ctrl[:] = np.asarray(s.data.physics.ctrl[i])
            mujoco.mj_step(m, d, pick_env.substeps)
            gap = np.abs(np.asarray(s.data.physics.qpos[i]) - d.qpos)
            worst_arm = max(worst_arm, float(gap[np.r_[ix.arm_qpos, ix.finger_qpos]].max()))
            cube = float(gap[ix.cube_qpos : ix.cube_qpos + 3].max())
            worst_cube = max(worst_cube, cube)
            worst_cube_late = max(worst_cube_late, cube) if t >= 10 else 0.0
    assert worst_arm < 1e-4 and worst_cube < 1e-3 and worst_cube_late < 1e-4, (
        worst_arm,
        worst_cube,
        worst_cube_late,
    )
    moved = np.abs(datas[0].qpos[:7] - np.asarray(HOME)).max()
    assert moved > 0.2  # the comparison covered real motion
