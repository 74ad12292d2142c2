"""The built-in Panda MJCF against an independent numpy implementation of Franka's DH table."""

import mujoco
import numpy as np

from sim.manipulator.model import SceneConfig, build_model, index_model

# Franka's published modified (Craig) DH parameters: a (m), d (m), alpha (rad) per joint, then
# the flange (d = 0.107 m); https://frankaemika.github.io/docs/control_parameters.html
DH = [
    (0.0, 0.333, 0.0),
    (0.0, 0.0, -np.pi / 2),
    (0.0, 0.316, np.pi / 2),
    (0.0825, 0.0, np.pi / 2),
    (-0.0825, 0.384, -np.pi / 2),
    (0.0, 0.0, np.pi / 2),
    (0.088, 0.0, np.pi / 2),
]
FLANGE_D = 0.107
LIMITS = [(-2.8973, 2.8973), (-1.7628, 1.7628), (-2.8973, 2.8973), (-3.0718, -0.0698),
          (-2.8973, 2.8973), (-0.0175, 3.7525), (-2.8973, 2.8973)]  # fmt: skip


def _craig(a: float, d: float, alpha: float, theta: float) -> np.ndarray:
    """Rx(alpha) Tx(a) Rz(theta) Tz(d) as a 4x4 homogeneous transform."""
    ca, sa, ct, st = np.cos(alpha), np.sin(alpha), np.cos(theta), np.sin(theta)
    return np.array(
        [
            [ct, -st, 0.0, a],
            [st * ca, ct * ca, -sa, -d * sa],
            [st * sa, ct * sa, ca, d * ca],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )


def _dh_flange(q: np.ndarray) -> np.ndarray:
    t = np.eye(4)
    for (a, d, alpha), theta in zip(DH, q, strict=True):
        t = t @ _craig(a, d, alpha, theta)
    return t @ _craig(0.0, FLANGE_D, 0.0, 0.0)


def test_forward_kinematics_matches_dh():
    cfg = SceneConfig()
    m = build_model(cfg)
    ix = index_model(m, cfg)
    np.testing.assert_allclose(ix.arm_range, LIMITS)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    flange = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, "flange")
    # Franka hand: rotated -pi/4 about the flange z axis, tool centre point 0.1034 m along it.
    c, s = np.cos(-np.pi / 4), np.sin(-np.pi / 4)
    hand = np.array([[c, -s, 0, 0], [s, c, 0, 0], [0, 0, 1, 0.1034], [0, 0, 0, 1.0]])
    for _ in range(20):
        q = rng.uniform(ix.arm_range[:, 0], ix.arm_range[:, 1])
        d.qpos[ix.arm_qpos] = q
        mujoco.mj_kinematics(m, d)
        ref = _dh_flange(q)
        np.testing.assert_allclose(d.site_xpos[flange], ref[:3, 3], atol=1e-5)
        np.testing.assert_allclose(d.site_xmat[flange].reshape(3, 3), ref[:3, :3], atol=1e-5)
        tcp = ref @ hand
        np.testing.assert_allclose(d.site_xpos[ix.ee_site], tcp[:3, 3], atol=1e-5)
        np.testing.assert_allclose(d.site_xmat[ix.ee_site].reshape(3, 3), tcp[:3, :3], atol=1e-5)


def test_torque_limits():
    cfg = SceneConfig()
    m = build_model(cfg)
    ix = index_model(m, cfg)
    np.testing.assert_allclose(m.actuator_forcerange[ix.arm_act, 1], [87] * 4 + [12] * 3)
    np.testing.assert_allclose(m.actuator_forcerange[ix.arm_act, 0], [-87] * 4 + [-12] * 3)
