"""The manipulator scene: a robot MJCF (ours or the user's) plus table, cube, goal and cameras.

`build_model(config)` loads the robot MJCF with `mujoco.MjSpec`, adds the scene around it and
compiles it; `index_model(model, config)` finds the named joints, actuators and sites the envs need
and raises one `ValueError` naming whatever is missing. World frame: z up, the table top is the
plane z = 0 and the robot base sits at the origin. Cameras: "front" (fixed, facing the robot
across the table) and "wrist" (on the body carrying the end-effector site, looking along the tool
axis past the fingers).

Collision masks (kept small for MJX): the cube has contype 1 / conaffinity 3, the table contype 1 /
conaffinity 2, our robot's hand and finger pads contype 2 / conaffinity 0, so the pads and the hand
touch the cube and the table and nothing else; the arm links are visual only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import mujoco
import numpy as np

PANDA_XML = Path(__file__).parent / "assets" / "panda.xml"
SCENE_NAMES = ("table", "cube", "cube_joint", "goal", "front", "wrist")
WRIST_CAMERAS = {
    "down": ((-0.07, 0.0, -0.085), (0.0, 0.0, 0.1), 75.0),
    "forward": ((-0.12, 0.0, -0.04), (0.05, 0.0, 0.03), 75.0),
}
"""The wrist cameras: (position, point looked at) in the end-effector site's frame (z = tool axis;
on our Panda in its home pose x points away from the base, so the camera sits on the robot's side
and faces the workspace), m, and the vertical field of view, degrees; image up is towards the tool
axis. The scene has "down"; `CameraRenderer(wrist_camera=...)` draws any of them.
- "down": 8.5 cm above and 7 cm behind the tool centre point, looking down past the fingers at a
  point 10 cm beyond it; the fingers sit at the image's top edge. Once the tool is low, the hand
  hides the table ahead of the fingers: a cube the tool stops short of leaves the image.
- "forward": 4 cm above and 12 cm behind the tool centre point, looking forwards and down past it;
  the gap between the fingers sits in the upper third, the table ahead of them above it."""


@dataclasses.dataclass(frozen=True)
class SceneConfig:
    """Robot model, the named elements the envs use, and the physics options."""

    model_path: str | None = None
    """Robot MJCF to load instead of the built-in Panda (e.g. a MuJoCo Menagerie panda.xml); it
    needs the joints, actuators and site named below, and position-servo actuators."""
    arm_joints: tuple[str, ...] = tuple(f"joint{i}" for i in range(1, 8))
    """Hinge joints of the arm, base to wrist; each needs an actuator on it."""
    finger_joints: tuple[str, ...] = ("finger_joint1", "finger_joint2")
    """Slide joints of the gripper fingers (opening per finger, m)."""
    ee_site: str = "tcp"
    """Site at the tool centre point between the finger pads."""
    cube_half_size: float = 0.02
    """Nominal cube half edge, m."""
    cube_mass: float = 0.1
    """Nominal cube mass, kg."""
    cube_friction: float = 1.0
    """Nominal sliding friction of the cube (the table's is lower: cube–table contacts use it)."""
    timestep: float = 0.005
    """Physics step, s."""
    integrator: Literal["euler", "implicitfast"] = "euler"
    """MuJoCo integrator (Euler treats joint damping implicitly; our servos' damping is joint
    damping). Choose implicitfast for a model whose actuators carry velocity gains."""
    iterations: int = 5
    """Constraint solver iterations."""
    ls_iterations: int = 8
    """Line-search iterations."""
    max_contact_points: int | None = 12
    """MJX keeps only this many deepest contacts per contact dimension (the MJCF numeric
    `max_contact_points`, which replaces a robot file's own; None: the file's, or all). MJX builds
    solver rows for every candidate contact whether it touches or not (24 here), so this bounds
    the solver's work; 12 covers the cube on the table plus both pads on it. C MuJoCo ignores it
    (it only makes the contacts that touch)."""
    impl: Literal["jax", "warp"] = "jax"
    """MJX implementation: "jax" (XLA, CPU or GPU) or "warp" (MuJoCo Warp's kernels called from
    XLA; needs `pip install "hoverfly[warp]"`, and a CUDA GPU to be fast)."""
    warp_envs: int | None = None
    """Warp only: the most envs stepped as one batch. Warp keeps one contact pool for the whole
    batch, `warp_envs` × `warp_contacts` slots; a larger batch drops contacts. None: `hoverfly
    train` sizes it for the run's largest batch (its envs, validation and eval episodes)."""
    warp_contacts: int = 24
    """Warp only: contact slots per env in the shared pool (Warp makes only the contacts that
    touch), and the bound on one env's contacts in its constraint rows."""


def _look_at(pos: np.ndarray, target: np.ndarray, up=(0.0, 0.0, 1.0)) -> list[float]:
    """Camera `xyaxes` looking from `pos` at `target` with image up towards `up` (parent frame)."""
    f = (target - pos) / np.linalg.norm(target - pos)
    right = np.cross(f, up)
    right /= np.linalg.norm(right)
    return [*right, *np.cross(right, f)]


def build_model(config: SceneConfig) -> mujoco.MjModel:
    """Compiles robot + scene. Raises `ValueError` for a missing or unloadable robot file."""
    path = Path(config.model_path) if config.model_path else PANDA_XML
    if not path.is_file():
        raise ValueError(f"robot model file not found: {path}")
    try:
        spec = mujoco.MjSpec.from_file(str(path))
    except Exception as e:  # mujoco raises ValueError/mujoco.FatalError with the parser message
        raise ValueError(f"cannot load robot model {path}: {e}") from e
    clash = [n for n in SCENE_NAMES if _has_name(spec, n)]
    if clash:
        raise ValueError(f"robot model {path} already defines scene name(s) {clash}")

    opt = spec.option
    opt.timestep = config.timestep
    opt.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{config.integrator.upper()}")
    opt.iterations = config.iterations
    opt.ls_iterations = config.ls_iterations
    if config.max_contact_points is not None:
        numeric = spec.numeric("max_contact_points") or spec.add_numeric(name="max_contact_points")
        numeric.data = [float(config.max_contact_points)]
    spec.compiler.autolimits = True

    world = spec.worldbody
    world.add_light(pos=[0.5, 0.0, 1.5], dir=[0.0, 0.0, -1.0], diffuse=[0.7, 0.7, 0.7])
    world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[1.0, 1.0, 0.05],
        rgba=[0.55, 0.45, 0.35, 1.0],
        contype=1,
        conaffinity=2,
        friction=[0.1, 0.005, 0.0001],
    )
    h = config.cube_half_size
    cube = world.add_body(name="cube", pos=[0.5, 0.0, h])
    cube.add_freejoint(name="cube_joint")
    cube.add_geom(
        name="cube",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=[h, h, h],
        mass=config.cube_mass,
        rgba=[0.8, 0.15, 0.1, 1.0],
        contype=1,
        conaffinity=3,
        condim=3,
        friction=[config.cube_friction, 0.005, 0.0001],
    )
    goal = world.add_body(name="goal", mocap=True, pos=[0.5, 0.2, h])
    goal.add_site(
        name="goal",
        type=mujoco.mjtGeom.mjGEOM_SPHERE,
        size=[0.015, 0.0, 0.0],
        rgba=[0.1, 0.8, 0.2, 0.6],
    )
    cam_pos = np.array([1.5, 0.0, 0.7])
    world.add_camera(name="front", pos=cam_pos, xyaxes=_look_at(cam_pos, np.array([0.4, 0, 0.1])))
    try:
        _add_wrist_camera(spec, config.ee_site)
        return spec.compile()
    except Exception as e:
        raise ValueError(f"cannot compile robot model {path} into the scene: {e}") from e


def _add_wrist_camera(spec: mujoco.MjSpec, ee_site: str) -> None:
    """Adds camera "wrist" ("down" of `WRIST_CAMERAS`) to the body that carries `ee_site`. The
    site's pose in its body is read from a first compile, which resolves any frame or orientation
    form the MJCF uses."""
    site = spec.site(ee_site)
    if site is None:  # index_model reports the missing site
        return
    m = spec.compile()
    sid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, ee_site)
    pos, quat, fovy = wrist_camera_pose(m.site_pos[sid], m.site_quat[sid], "down")
    site.parent.add_camera(name="wrist", pos=pos, quat=quat, fovy=fovy)


def wrist_camera_pose(
    site_pos: np.ndarray, site_quat: np.ndarray, camera: str
) -> tuple[np.ndarray, np.ndarray, float]:
    """(position [3], quaternion [4] (w first), fovy) in the site's body of the wrist camera
    `camera` of `WRIST_CAMERAS`, for the end-effector site at `site_pos`, `site_quat` in that
    body. ValueError for an unknown camera."""
    if camera not in WRIST_CAMERAS:
        raise ValueError(f"wrist camera {camera!r} is not one of {list(WRIST_CAMERAS)}")
    cam_pos, cam_target, fovy = WRIST_CAMERAS[camera]
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, np.asarray(site_quat, np.float64))
    rot = rot.reshape(3, 3)
    pos = site_pos + rot @ cam_pos
    target = site_pos + rot @ cam_target
    up = rot @ (-cam_pos[0], -cam_pos[1], 0.0)  # towards the tool axis
    xyaxes = np.reshape(_look_at(pos, target, up), (2, 3))
    frame = np.stack([xyaxes[0], xyaxes[1], np.cross(xyaxes[0], xyaxes[1])], axis=1)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, frame.reshape(-1))
    return pos, quat, fovy


def _has_name(spec: mujoco.MjSpec, name: str) -> bool:
    finders = (spec.body, spec.geom, spec.joint, spec.site, spec.camera)
    return any(find(name) is not None for find in finders)


@dataclasses.dataclass(frozen=True)
class ModelIndex:
    """Static addresses into a compiled scene (numpy, so they stay static under jit)."""

    arm_joint: np.ndarray
    """[7] ids of the arm joints."""
    arm_qpos: np.ndarray
    """[7] qpos addresses of the arm joints."""
    arm_dof: np.ndarray
    """[7] dof addresses of the arm joints."""
    arm_range: np.ndarray
    """[7, 2] arm joint limits, rad."""
    finger_qpos: np.ndarray
    """[F] qpos addresses of the finger joints."""
    finger_range: np.ndarray
    """[F, 2] finger joint ranges, m."""
    arm_act: np.ndarray
    """[7] actuator of each arm joint."""
    grip_act: np.ndarray
    """[G] gripper actuators (on a finger joint, or on a tendon over finger joints)."""
    ee_site: int
    cube_body: int
    cube_geom: int
    cube_qpos: int
    """qpos address of the cube's free joint: [x, y, z, qw, qx, qy, qz] (world)."""
    cube_dof: int
    """dof address of the cube's free joint: [v (world, m/s), ω (body, rad/s)]."""
    goal_mocap: int


def index_model(m: mujoco.MjModel, config: SceneConfig) -> ModelIndex:
    """Looks up every named element; one `ValueError` lists all that are missing or unsuitable."""
    problems: list[str] = []

    def joint(name: str, jtype: mujoco.mjtJoint) -> int:
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            problems.append(f"joint {name!r} is missing")
        elif m.jnt_type[jid] != jtype:
            problems.append(f"joint {name!r} is not a {jtype.name[6:].lower()} joint")
        return jid

    arm = [joint(n, mujoco.mjtJoint.mjJNT_HINGE) for n in config.arm_joints]
    fingers = [joint(n, mujoco.mjtJoint.mjJNT_SLIDE) for n in config.finger_joints]
    if len(arm) != 7:
        problems.append(f"arm_joints names {len(arm)} joints, 7 needed")
    site = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, config.ee_site)
    if site < 0:
        problems.append(f"end-effector site {config.ee_site!r} is missing")
    if problems:
        raise ValueError(_message(config, problems))
    chain, body = set(), int(m.site_bodyid[site])
    while body > 0:
        chain.add(body)
        body = int(m.body_parentid[body])
    for name, j in zip(config.arm_joints, arm, strict=True):
        if m.jnt_bodyid[j] not in chain:
            problems.append(f"arm joint {name!r} does not move site {config.ee_site!r}")

    joint_act = {
        int(m.actuator_trnid[a, 0]): a
        for a in range(m.nu)
        if m.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT
    }
    arm_act = []
    for name, j in zip(config.arm_joints, arm, strict=True):
        if j not in joint_act:
            problems.append(f"no actuator drives arm joint {name!r}")
        arm_act.append(joint_act.get(j, -1))
    grip = [joint_act[j] for j in fingers if j in joint_act]
    grip += [a for a in range(m.nu) if _tendon_on(m, a, fingers)]
    if not grip:
        problems.append(f"no actuator drives the finger joints {list(config.finger_joints)}")
    if problems:
        raise ValueError(_message(config, problems))

    cube_joint = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, "cube_joint")
    return ModelIndex(
        arm_joint=np.array(arm),
        arm_qpos=m.jnt_qposadr[arm].copy(),
        arm_dof=m.jnt_dofadr[arm].copy(),
        arm_range=m.jnt_range[arm].copy(),
        finger_qpos=m.jnt_qposadr[fingers].copy(),
        finger_range=m.jnt_range[fingers].copy(),
        arm_act=np.array(arm_act),
        grip_act=np.array(grip),
        ee_site=site,
        cube_body=mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "cube"),
        cube_geom=mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "cube"),
        cube_qpos=int(m.jnt_qposadr[cube_joint]),
        cube_dof=int(m.jnt_dofadr[cube_joint]),
        goal_mocap=int(m.body_mocapid[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "goal")]),
    )


def _tendon_on(m: mujoco.MjModel, act: int, joints: list[int]) -> bool:
    """Whether actuator `act` drives a fixed tendon that spans one of `joints`."""
    if m.actuator_trntype[act] != mujoco.mjtTrn.mjTRN_TENDON:
        return False
    t = m.actuator_trnid[act, 0]
    wraps = range(m.tendon_adr[t], m.tendon_adr[t] + m.tendon_num[t])
    return any(
        m.wrap_type[w] == mujoco.mjtWrap.mjWRAP_JOINT and m.wrap_objid[w] in joints for w in wraps
    )


def _message(config: SceneConfig, problems: list[str]) -> str:
    path = config.model_path or PANDA_XML
    return f"robot model {path} is unsuitable: " + "; ".join(problems)


__all__ = ["PANDA_XML", "ModelIndex", "SceneConfig", "build_model", "index_model"]
