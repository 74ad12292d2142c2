"""Camera images of the arm scene with MuJoCo's C renderer on headless OpenGL, and policy videos.

Headless GL: `setup_gl()` picks the process's backend once: `PYOPENGL_PLATFORM` or `MUJOCO_GL` if
either names egl or osmesa, else EGL if a context can be made (probed in a child process, because
PyOpenGL binds itself to one platform at its first import), else OSMesa; it exports the choice as
`MUJOCO_GL` and `PYOPENGL_PLATFORM` for child processes. `CameraRenderer` creates its GL context
from that backend's class itself, so it works whatever `import mujoco` chose earlier (mujoco reads
`MUJOCO_GL` once, at import, for `mujoco.Renderer`). EGL needs no GPU: Mesa's llvmpipe serves it.

Images are [H, W, 3] uint8 RGB, row 0 at the top; several cameras are laid side by side.
"""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from sim.env import Env, State
from sim.manipulator.env import ArmEnv
from sim.manipulator.model import wrist_camera_pose
from sim.wrappers import batch_where

GL_BACKENDS = ("egl", "osmesa")
APT_PACKAGES = {"egl": "libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0", "osmesa": "libosmesa6"}
"""Debian/Ubuntu packages each headless backend needs (EGL uses Mesa's llvmpipe without a GPU)."""
SHADOW_SIZE = 1024
"""Shadow-map edge, px: as sharp as MuJoCo's default 4096 at these image sizes, and about 3x
faster in software GL."""
_EGL_PROBE = "import mujoco.egl as e; e.GLContext(8, 8).free()"


@functools.cache
def setup_gl() -> str:
    """This process's headless OpenGL backend, "egl" or "osmesa" (chosen once; see the module
    docstring), exported as `MUJOCO_GL` and `PYOPENGL_PLATFORM`."""
    backend = _bound_backend()
    if backend is None:
        env = os.environ | {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
        probe = subprocess.run(  # close_fds=False: posix_spawn, no fork of a threaded process
            [sys.executable, "-c", _EGL_PROBE], env=env, capture_output=True, close_fds=False
        )
        backend = "egl" if probe.returncode == 0 else "osmesa"
    os.environ["MUJOCO_GL"] = os.environ["PYOPENGL_PLATFORM"] = backend
    return backend


def _bound_backend() -> str | None:
    """The backend already fixed by an imported PyOpenGL or by the environment, if any."""
    if "OpenGL.platform" in sys.modules:
        name = type(sys.modules["OpenGL.platform"].PLATFORM).__name__  # e.g. EGLPlatform
        backend = {"EGLPlatform": "egl", "OSMesaPlatform": "osmesa"}.get(name)
        if backend is None:
            raise RuntimeError(
                f"PyOpenGL was imported for {name} before headless rendering was set up; set "
                "MUJOCO_GL=egl (or osmesa) in the environment before starting Python"
            )
        return backend
    for var in ("PYOPENGL_PLATFORM", "MUJOCO_GL"):
        if os.environ.get(var, "").lower() in GL_BACKENDS:
            return os.environ[var].lower()
    return None


def _gl_context(width: int, height: int):
    """A new headless GL context of the `setup_gl()` backend; `RuntimeError` naming the packages
    to install when none can be made."""
    backend = setup_gl()
    try:
        if backend == "egl":
            from mujoco.egl import GLContext
        else:
            from mujoco.osmesa import GLContext
        return GLContext(width, height)
    except Exception as e:
        raise RuntimeError(
            f"no headless OpenGL context ({backend}: {type(e).__name__}: {e}). Install EGL "
            f"(apt-get install {APT_PACKAGES['egl']}) or OSMesa (apt-get install "
            f"{APT_PACKAGES['osmesa']}), or set MUJOCO_GL to the one that works; "
            f'`MUJOCO_GL=egl python -c "{_EGL_PROBE}"` shows why EGL fails'
        ) from e


class CameraRenderer:
    """Images of an arm env's scene from host (numpy) arrays: C MuJoCo kinematics + OpenGL.

    `camera` names one camera of the scene ("front", "wrist") or a sequence of them, drawn side by
    side: images are [height, width · cameras, 3] uint8. Holds a GL context and its own copy of
    the env's `mujoco.MjModel` (the cube's size is set per image; the robot's sites are hidden,
    the goal marker is shown; the "wrist" camera is `wrist_camera` of
    `sim.manipulator.model.WRIST_CAMERAS`); free them with `close()` or use the renderer as a
    context manager.
    """

    def __init__(
        self,
        env: Env,
        camera: str | Sequence[str] = "front",
        height: int = 240,
        width: int = 320,
        wrist_camera: str = "down",
    ):
        arm = env.unwrapped
        if not isinstance(arm, ArmEnv):
            raise TypeError(f"CameraRenderer needs an arm env, got {type(arm).__name__}")
        names = (camera,) if isinstance(camera, str) else tuple(camera)
        known = [arm.mj_model.camera(i).name for i in range(arm.mj_model.ncam)]
        missing = [n for n in names if n not in known]
        if missing or not names:
            raise ValueError(f"unknown camera(s) {missing or names}; the scene has {known}")
        self.cameras, self.height, self.width = names, height, width
        self.model = m = copy.deepcopy(arm.mj_model)
        m.vis.global_.offwidth = max(width, m.vis.global_.offwidth)
        m.vis.global_.offheight = max(height, m.vis.global_.offheight)
        m.vis.quality.shadowsize = min(SHADOW_SIZE, m.vis.quality.shadowsize)
        m.site_group[np.arange(m.nsite) != m.site("goal").id] = 5  # robot markers: group not drawn
        if wrist_camera != "down":  # "down" is the scene's own
            site, cid = arm.index.ee_site, m.camera("wrist").id
            pose = wrist_camera_pose(m.site_pos[site], m.site_quat[site], wrist_camera)
            m.cam_pos[cid], m.cam_quat[cid], m.cam_fovy[cid] = pose
        self._cube_geom = arm.index.cube_geom
        self._data = mujoco.MjData(m)
        self._option = mujoco.MjvOption()
        self._scene = mujoco.MjvScene(m, maxgeom=2000)
        self._cams = []
        for name in names:
            cam = mujoco.MjvCamera()
            cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
            cam.fixedcamid = m.camera(name).id
            self._cams.append(cam)
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._pixels = np.empty((height, width, 3), np.uint8)
        self._gl = _gl_context(width, height)
        self._gl.make_current()
        self._context = mujoco.MjrContext(m, mujoco.mjtFontScale.mjFONTSCALE_100)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._context)

    def frames(
        self, qpos: np.ndarray, mocap_pos: np.ndarray, cube_half_size: float | np.ndarray
    ) -> Iterator[np.ndarray]:
        """Yields one image [H, W · cameras, 3] uint8 per row of `qpos` [N, nq] (the scene's
        generalized positions, world frame, m and unit quaternions) and `mocap_pos`
        [N, nmocap, 3] (world, m); `cube_half_size` [] or [N] is the cube's half edge, m."""
        qpos = np.asarray(qpos).reshape(-1, self.model.nq)
        mocap = np.asarray(mocap_pos).reshape(len(qpos), self.model.nmocap, 3)
        half = np.broadcast_to(np.asarray(cube_half_size, np.float64).reshape(-1), len(qpos))
        for q, mp, h in zip(qpos, mocap, half, strict=True):
            yield self._draw(q, mp, h)

    def render(
        self, qpos: np.ndarray, mocap_pos: np.ndarray, cube_half_size: float | np.ndarray
    ) -> np.ndarray:
        """[N, H, W · cameras, 3] uint8 images of N scene states (arguments as in `frames`)."""
        n = np.asarray(qpos).reshape(-1, self.model.nq).shape[0]
        out = np.empty((n, self.height, self.width * len(self.cameras), 3), np.uint8)
        for i, image in enumerate(self.frames(qpos, mocap_pos, cube_half_size)):
            out[i] = image
        return out

    def images(self, state: State) -> np.ndarray:
        """[B, H, W · cameras, 3] uint8 images of a batched arm-env state (leading axis B on
        every leaf; an unbatched state gives B = 1), e.g. the observations of a VLA policy."""
        data = jax.device_get(state.data)
        return self.render(data.physics.qpos, data.physics.mocap_pos, data.params.cube_half_size)

    def _draw(self, qpos: np.ndarray, mocap_pos: np.ndarray, half: float) -> np.ndarray:
        m, d = self.model, self._data
        d.qpos[:], d.mocap_pos[:] = qpos, mocap_pos
        m.geom_size[self._cube_geom] = half
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        mujoco.mj_camlight(m, d)
        self._gl.make_current()
        out = np.empty((self.height, self.width * len(self._cams), 3), np.uint8)
        for i, cam in enumerate(self._cams):
            mujoco.mjv_updateScene(
                m, d, self._option, None, cam, mujoco.mjtCatBit.mjCAT_ALL, self._scene
            )
            mujoco.mjr_render(self._rect, self._scene, self._context)
            mujoco.mjr_readPixels(self._pixels, None, self._rect, self._context)
            out[:, i * self.width : (i + 1) * self.width] = self._pixels[::-1]  # GL rows: bottom up
        return out

    def close(self) -> None:
        """Frees the MuJoCo render context and the GL context (idempotent)."""
        if self._gl is not None:
            self._gl.make_current()
            self._context.free()
            self._gl.free()
            self._gl = None

    def __enter__(self) -> CameraRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_video(frames: Iterable[np.ndarray], path: str | Path, fps: float) -> Path:
    """Writes `frames` (an array [T, H, W, 3] uint8 or any iterable of [H, W, 3] images, which
    is consumed as it is encoded) to the H.264 mp4 `path` at `fps` frames/s, atomically: through a
    temp file in the same folder, then `os.replace`. H and W must be even. Returns `path`."""
    import imageio.v2 as imageio  # needs imageio-ffmpeg (bundles an ffmpeg binary)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp.mp4")
    os.close(fd)
    try:
        count = 0
        options = {"fps": fps, "codec": "libx264", "macro_block_size": 2}
        with imageio.get_writer(tmp, "FFMPEG", **options, ffmpeg_log_level="error") as writer:
            for frame in frames:
                writer.append_data(np.asarray(frame))
                count += 1
        if count == 0:
            raise ValueError(f"no frames to write to {path}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def record_rollout(
    env: Env, policy_fn: Callable, key: jax.Array, episodes: int, steps: int
) -> dict[str, jax.Array]:
    """Runs `episodes` episodes of `steps` steps of an arm env (vmapped, `jax.lax.scan`, no
    auto-reset; an episode that terminates is frozen from then on) and records its scene.

    policy_fn(obs [B, obs], key) -> (action [B, A], extras), as in `algos.evaluate.rollout`.
    Returns `qpos` [T+1, B, nq], `mocap_pos` [T+1, B, nmocap, 3] (world, m), `cube_half_size`
    [B] (m) and `done` [T+1, B] (1 from the termination step on); row 0 is the initial state.
    """
    key_reset, key_run = jax.random.split(key)
    state = jax.vmap(env.reset)(jax.random.split(key_reset, episodes))

    def scene(state: State, dead: jax.Array) -> dict[str, jax.Array]:
        px = state.data.physics
        return {"qpos": px.qpos, "mocap_pos": px.mocap_pos, "done": dead}

    def step(carry, key_step):
        state, dead = carry
        action, _ = policy_fn(state.obs["state"], key_step)
        nstate = jax.vmap(env.step)(state, action)
        frozen = batch_where(dead <= 0, nstate, state)
        ndead = jnp.maximum(dead, nstate.done)
        return (frozen, ndead), scene(frozen, ndead)

    dead0 = jnp.zeros(episodes)
    _, traj = jax.lax.scan(step, (state, dead0), jax.random.split(key_run, steps))
    traj = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), scene(state, dead0), traj)
    return traj | {"cube_half_size": state.data.params.cube_half_size}


def policy_video(
    env: Env,
    policy_fn: Callable,
    key: jax.Array,
    path: str | Path,
    episodes: int = 1,
    steps: int | None = None,
    camera: str | Sequence[str] = "front",
    height: int = 240,
    width: int = 320,
    progress: bool = True,
) -> Path:
    """Runs `policy_fn` (see `record_rollout`) on an arm env for `episodes` episodes of `steps`
    control steps (default: the env's episode length) and writes them one after another as an
    mp4 at real time (1 / env.dt frames/s, T + 1 frames per episode) from `camera`. Renders with
    a progress bar on stderr unless `progress` is False. Returns `path`."""
    arm = env.unwrapped
    if not isinstance(arm, ArmEnv):
        raise TypeError(f"policy_video needs an arm env, got {type(arm).__name__}")
    steps = arm.config.episode_steps if steps is None else steps
    with CameraRenderer(env, camera, height, width) as renderer:  # bad camera: fail before the run
        run = jax.jit(
            functools.partial(record_rollout, env, policy_fn, episodes=episodes, steps=steps),
            compiler_options=env.compiler_options,
        )
        traj = jax.device_get(run(key))
        frames = (
            image
            for e in range(episodes)
            for image in renderer.frames(
                traj["qpos"][:, e], traj["mocap_pos"][:, e], traj["cube_half_size"][e]
            )
        )
        if progress:
            from rich.console import Console
            from rich.progress import track

            total = episodes * (steps + 1)
            frames = track(frames, "rendering", total, console=Console(stderr=True))
        return write_video(frames, path, fps=1.0 / env.dt)


__all__ = [
    "APT_PACKAGES",
    "GL_BACKENDS",
    "CameraRenderer",
    "policy_video",
    "record_rollout",
    "setup_gl",
    "write_video",
]
