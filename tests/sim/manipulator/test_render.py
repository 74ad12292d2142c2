"""Cameras and videos with the real MuJoCo renderer on headless GL (EGL, or OSMesa)."""

import imageio.v3 as iio
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from sim.env import State
from sim.manipulator import HOME, ArmConfig, ArmData, ArmEnv, SceneConfig, build_model
from sim.manipulator._mjx import mjx
from sim.manipulator.render import CameraRenderer, policy_video, write_video

H, W = 96, 96


@pytest.fixture(scope="module")
def env():
    return ArmEnv(ArmConfig(task="pick_place"))


@pytest.fixture(scope="module")
def renderer(env):
    with CameraRenderer(env, ("front", "wrist"), H, W) as r:
        yield r


def scene(env, cube_xy):
    """(qpos [N, nq], mocap_pos [N, 1, 3]): arm at HOME, fingers open, one cube position per
    row of `cube_xy` [N, 2] (m)."""
    ix, m = env.index, env.mj_model
    qpos = np.tile(m.qpos0, (len(cube_xy), 1))
    qpos[:, ix.arm_qpos] = HOME
    qpos[:, ix.finger_qpos] = ix.finger_range[:, 1]
    qpos[:, ix.cube_qpos : ix.cube_qpos + 2] = cube_xy
    qpos[:, ix.cube_qpos + 2] = 0.02
    mocap = np.tile([[0.5, 0.2, 0.02]], (len(cube_xy), 1, 1))
    return qpos, mocap


def red(image):
    """[H, W] mask of the cube's red pixels."""
    r, g, b = (image[..., i].astype(int) for i in range(3))
    return (r > 60) & (r > 2 * g) & (r > 2 * b)


def test_front_and_wrist_images(env, renderer):
    qpos, mocap = scene(env, [[0.5, -0.1], [0.5, 0.1], env.home_tcp[:2]])
    images = renderer.render(qpos, mocap, 0.02)
    assert images.shape == (3, H, 2 * W, 3) and images.dtype == np.uint8
    front, wrist = images[..., :W, :], images[..., W:, :]
    assert front.std() > 20 and wrist.std() > 20  # not blank
    assert np.abs(front.astype(int) - wrist).mean() > 20
    # the cube's red blob follows the cube: world +y is image right in the front camera and image
    # left in the wrist camera (which faces +x in the home pose)
    assert all(red(f).sum() >= 5 for f in (*front, *wrist))
    front_x, wrist_x = ([np.nonzero(red(f))[1].mean() for f in v] for v in (front, wrist))
    assert front_x[1] - front_x[0] > 10 and wrist_x[0] - wrist_x[1] > 10
    # the wrist camera sits beside the tool axis along the image's vertical: a cube right under
    # the tool is on the image's vertical midline
    assert abs(wrist_x[2] - (W - 1) / 2) < 3
    # the episode's cube size is drawn
    big = renderer.render(qpos[:1], mocap[:1], 0.04)[0]
    assert red(big[:, :W]).sum() > 2 * red(front[0]).sum()


def test_single_camera_and_state_images(env, renderer):
    qpos, mocap = scene(env, [[0.5, 0.0], [0.5, 0.1]])
    pair = renderer.render(qpos, mocap, [0.02, 0.04])
    with CameraRenderer(env, "wrist", H, W) as wrist:
        np.testing.assert_array_equal(wrist.render(qpos, mocap, [0.02, 0.04]), pair[..., W:, :])
    # a batched env state [B = 2] (built directly: a jitted reset costs ~15 s of compiling here;
    # test_policy_video renders real reset states)
    px = jax.tree.map(lambda x: jnp.stack([x, x]), mjx.make_data(env.mjx_model))
    params = jax.tree.map(lambda x: jnp.stack([x, x]), env.nominal_params)
    data = ArmData(
        px.replace(qpos=qpos, mocap_pos=mocap),
        params.replace(cube_half_size=jnp.array([0.02, 0.04])),
        goal=mocap[:, 0],
        last_action=jnp.zeros((2, env.action_size)),
        step=jnp.zeros(2, jnp.int32),
        reached=jnp.zeros(2),
    )
    state = State(data=data, obs={}, reward=jnp.zeros(2), done=jnp.zeros(2))
    np.testing.assert_array_equal(renderer.images(state), pair)


def test_wrist_camera_looks_along_the_tool_axis(tmp_path):
    """On our Panda and on a user MJCF whose tool site sits in a rotated frame."""
    user = tmp_path / "arm.xml"
    user.write_text(
        '<mujoco><worldbody><body name="b" pos="0.3 0 0.5"><joint/><geom size="0.05"/>'
        '<frame euler="0.3 0 0"><site name="ee" pos="0 0 -0.1" zaxis="1 0 -1"/></frame>'
        "</body></worldbody></mujoco>"
    )
    for path, site in ((None, "tcp"), (str(user), "ee")):
        m = build_model(SceneConfig(model_path=path, ee_site=site))
        d = mujoco.MjData(m)
        mujoco.mj_forward(m, d)
        cam, s = m.camera("wrist").id, m.site(site).id
        assert m.cam_bodyid[cam] == m.site_bodyid[s]
        tool = d.site_xmat[s].reshape(3, 3)[:, 2]
        view = -d.cam_xmat[cam].reshape(3, 3)[:, 2]  # cameras look along their -z
        assert 0.9 < view @ tool < 0.97  # tilted ~21 deg towards the axis
        np.testing.assert_allclose((d.cam_xpos[cam] - d.site_xpos[s]) @ tool, -0.085, atol=1e-9)


def test_forward_wrist_camera_sees_a_cube_ahead_of_the_fingers(env, renderer):
    """A cube 4 and 6 cm ahead of the tool centre point, at the fingers' height: hidden by the
    hand from the "down" wrist camera, in view of the "forward" one."""
    tcp = np.asarray(env.home_tcp)
    qpos, mocap = scene(env, tcp[:2] + [[0.04, 0.0], [0.06, 0.0]])
    qpos[:, env.index.cube_qpos + 2] = tcp[2] - 0.01
    down = renderer.render(qpos, mocap, 0.02)[..., W:, :]
    with CameraRenderer(env, ("front", "wrist"), H, W, wrist_camera="forward") as r:
        both = r.render(qpos, mocap, 0.02)
    np.testing.assert_array_equal(both[..., :W, :], renderer.render(qpos, mocap, 0.02)[..., :W, :])
    for hidden, seen in zip(down, both[..., W:, :], strict=True):
        assert red(hidden).sum() < 30 and red(seen).sum() > 200
    with pytest.raises(ValueError, match="wrist camera 'side' is not one of"):
        CameraRenderer(env, "wrist", H, W, wrist_camera="side")


def test_unknown_camera(env):
    with pytest.raises(ValueError, match="unknown camera.*'top'.*front"):
        CameraRenderer(env, ("front", "top"), H, W)


def test_write_video(env, renderer, tmp_path):
    qpos, mocap = scene(env, np.stack([np.full(5, 0.5), np.linspace(-0.1, 0.1, 5)], -1))
    path = write_video(renderer.frames(qpos, mocap, 0.02), tmp_path / "out" / "v.mp4", fps=10)
    video = iio.imread(path, plugin="FFMPEG")
    assert path.stat().st_size > 0 and video.shape == (5, H, 2 * W, 3)
    assert [p.name for p in path.parent.iterdir()] == ["v.mp4"]  # no temp file left
    with pytest.raises(ValueError, match="no frames"):
        write_video([], tmp_path / "empty.mp4", fps=10)
    assert not list(tmp_path.glob("*empty*")) and not list(tmp_path.glob(".*"))


def test_policy_video(env, tmp_path):
    def policy(obs, key):
        return jnp.tile(env.default_action, (obs.shape[0], 1)), {}

    path = policy_video(
        env, policy, jax.random.key(0), tmp_path / "p.mp4", 2, 2, "wrist", H, W, progress=False
    )
    assert iio.imread(path, plugin="FFMPEG").shape == (2 * 3, H, W, 3)
