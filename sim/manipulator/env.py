"""Arm environments on MJX: `arm-reach`, `arm-push`, `arm-pick-place` (STYLE.md §2 contract).

One unbatched env over `mjx.Model`/`mjx.Data` (batch with `sim.wrappers`). World frame z up, table
top at z = 0, robot base at the origin. Actions in [-1, 1]:
- `joint_delta` [8]: arm joint-target deltas (× `joint_step` rad) and the gripper opening
  (−1 closed … 1 open), absolute.
- `cartesian` [4]: tool-centre-point deltas (× `ee_step` m, world frame) and the gripper; the joint
  targets follow by one damped-least-squares step of differential IK that also holds the
  gripper's home orientation (analytic Jacobian from the joint axes and anchors of one MJX
  kinematics pass).
Per-episode physics parameters (`ArmParams`) live in the state, so domain randomization
(`sim.manipulator.randomization`) varies them per env under vmap.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from flax import struct

from sim.env import Env, State
from sim.manipulator import _mjx
from sim.manipulator.model import SceneConfig, build_model, index_model

if TYPE_CHECKING:
    from mujoco import mjx


# MJX's step and kinematics jitted once per process: JAX keeps a jitted function's trace for
# arguments of the same shapes, so each program built on an arm env (collection, evaluation, RL,
# residual wrappers), and each env made with the same scene, reuses it instead of tracing MJX
# again (~6 s on a 2-core CPU); XLA inlines the call, so the compiled program is the same.
# mjx itself is imported at the first call (see `sim.manipulator._mjx`).
@jax.jit
def _mjx_step(m: mjx.Model, d: mjx.Data) -> mjx.Data:
    return _mjx.mjx.step(m, d)


@jax.jit
def _mjx_kinematics(m: mjx.Model, d: mjx.Data) -> mjx.Data:
    return _mjx.mjx.kinematics(m, d)


HOME = (0.0, -0.785398, 0.0, -2.356194, 0.0, 1.570796, 0.785398)
"""Franka's "ready" pose, rad: the tool points straight down 0.49 m above the table."""


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """Initial-state and goal distributions (world frame, m, rad)."""

    joint_noise: float = 0.05
    """Half-width of the uniform offset on each arm joint from `HOME`, rad."""
    cube_center: tuple[float, float] = (0.5, 0.0)
    """Centre of the cube's start area on the table, m."""
    cube_range: float = 0.1
    """Half-width of the cube's start area per axis, m."""
    cube_yaw: float = 0.25
    """Half-width of the cube's start yaw, rad."""
    goal_range: float = 0.15
    """Half-width of the goal area per axis around `cube_center` (push, pick-place), m."""
    goal_height: tuple[float, float] = (0.0, 0.2)
    """Pick-place goal height above the resting cube centre, m."""
    goal_targets: tuple[tuple[float, float, float], ...] = ()
    """Pick-place: when given, the goal is one of these targets, uniformly: (x, y, height above
    the resting cube centre), m; discrete goals that an instruction can name (`vla.collect`).
    Empty: the random goal box of `goal_range` and `goal_height`."""
    reach_low: tuple[float, float, float] = (0.3, -0.3, 0.1)
    """Reach goal box lower corner, m."""
    reach_high: tuple[float, float, float] = (0.65, 0.3, 0.5)
    """Reach goal box upper corner, m."""


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """r = Σ terms, each logged as `metrics["reward/<term>"]`; distances d shaped as
    1 − tanh(d / `distance_scale`)."""

    reach: float = 1.0
    """Tool centre point → goal (reach) or → cube (push, pick-place)."""
    grasp: float = 1.0
    """Pick-place: the gripper commanded closed (0 open … 1 closed) while the tool centre point is
    within `reach_radius` of the cube: pays for the step between reaching and lifting, which PPO
    from scratch otherwise never takes (it held the tool at the cube, lift term ~1e-4)."""
    lift: float = 2.0
    """Pick-place: cube height above its rest height, clipped at `lift_height`, normalized."""
    goal: float = 4.0
    """Cube → goal (push: horizontal distance, pick-place: 3-D), counted once the tool has come
    within `reach_radius` of the cube in the episode (MuJoCo Playground's latch: no reward for
    a cube that already lies near the goal)."""
    reach_radius: float = 0.02
    """m."""
    success: float = 2.0
    """Bonus while the success condition holds."""
    action_rate: float = 0.01
    """Penalty on ‖a_t − a_{t−1}‖²."""
    distance_scale: float = 0.25
    """m (0.1 left the reach term flat beyond 0.2 m: 1 − tanh(3) = 0.005)."""
    lift_height: float = 0.05
    """m."""


@dataclasses.dataclass(frozen=True)
class ArmConfig:
    """Arm environment configuration."""

    task: Literal["reach", "push", "pick_place"] = "reach"
    """Move the tool to a goal, push the cube to a goal on the table, or pick and place it."""
    action_space: Literal["joint_delta", "cartesian"] = "joint_delta"
    """Joint-target deltas + gripper [8], or tool Cartesian deltas + gripper through IK [4]."""
    ctrl_dt: float = 0.02
    """Control period, s (50 Hz); a multiple of `scene.timestep`."""
    joint_step: float = 0.05
    """Joint-target change per control step at |a| = 1, rad."""
    ee_step: float = 0.01
    """Tool-target change per control step at |a| = 1, m."""
    ik_damping: float = 0.05
    """Damped-least-squares λ (m, rad)."""
    success_threshold: float = 0.03
    """Success when the controlled distance (tool–goal or cube–goal) is below this, m."""
    episode_steps: int = 250
    """Episode length in control steps (truncation, applied by the episode wrapper)."""
    scene: SceneConfig = SceneConfig()
    init: InitConfig = InitConfig()
    reward: RewardConfig = RewardConfig()


@struct.dataclass
class ArmParams:
    """Per-episode physics parameters (traced, so randomizable per env).

    cube_half_size: [] m. cube_mass: [] kg. cube_friction: [] sliding coefficient.
    gain_scale: [7] factor on each arm servo's position gain kp (and a velocity gain, if any).
    """

    cube_half_size: jax.Array
    cube_mass: jax.Array
    cube_friction: jax.Array
    gain_scale: jax.Array

    def as_vector(self) -> jax.Array:
        """[10] the parameters in the privileged observation."""
        c = jnp.stack([self.cube_half_size, self.cube_mass, self.cube_friction])
        return jnp.concatenate([c, self.gain_scale])


@struct.dataclass
class ArmData:
    """physics: MJX state. params: episode parameters. goal: [3] world goal position, m.
    last_action: [A] previous action. step: [] int32 control steps. reached: [] 1 once the tool
    has been within `RewardConfig.reach_radius` of the cube this episode."""

    physics: mjx.Data
    params: ArmParams
    goal: jax.Array
    last_action: jax.Array
    step: jax.Array
    reached: jax.Array


def obs_fields(action_size: int) -> tuple[tuple[str, int], ...]:
    """Layout of `obs["state"]` (world frame; positions m, angles rad, velocities per s)."""
    return (
        ("joint_pos", 7),
        ("joint_vel", 7),
        ("finger_pos", 2),
        ("tcp_pos", 3),
        ("cube_pos", 3),
        ("cube_quat", 4),
        ("goal_pos", 3),
        ("cube_minus_tcp", 3),
        ("goal_minus_cube", 3),
        ("goal_minus_tcp", 3),
        ("last_action", action_size),
    )


class ArmEnv(Env):
    """A 7-DoF arm with a parallel gripper, a cube and a goal on a table; MJX physics."""

    def __init__(self, config: ArmConfig = ArmConfig()):
        sub = config.ctrl_dt / config.scene.timestep
        if config.ctrl_dt <= 0 or abs(sub - round(sub)) > 1e-6 or round(sub) < 1:
            raise ValueError(
                f"ctrl_dt {config.ctrl_dt} must be a positive multiple of the physics timestep "
                f"{config.scene.timestep}"
            )
        if any(len(t) != 3 for t in config.init.goal_targets):
            raise ValueError(
                f"init.goal_targets: each target is (x, y, height), got {config.init.goal_targets}"
            )
        self.config = config
        self.substeps = round(sub)
        self.mj_model = build_model(config.scene)
        self.index = index_model(self.mj_model, config.scene)
        if config.task == "reach":
            # Nothing to touch: contacts are off, which makes an MJX step ~5.6x cheaper on the
            # CPU (README, "Manipulators"), and a large damping on the parked cube's free joint
            # holds it where it is (it sinks ~1 µm/s; Euler damps implicitly).
            self.mj_model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
            dof = self.index.cube_dof
            self.mj_model.dof_damping[dof : dof + 6] = 1e6
        if len(self.index.finger_qpos) != 2:
            raise ValueError("the arm envs need exactly two finger joints")
        self.mjx_model, self._data0 = _mjx.put_scene(self.mj_model, config.scene)
        h = config.scene.cube_half_size
        self.nominal_params = ArmParams(
            cube_half_size=jnp.asarray(h, jnp.float32),
            cube_mass=jnp.asarray(config.scene.cube_mass, jnp.float32),
            cube_friction=jnp.asarray(config.scene.cube_friction, jnp.float32),
            gain_scale=jnp.ones(7),
        )
        d = mujoco.MjData(self.mj_model)
        d.qpos[self.index.arm_qpos] = HOME
        mujoco.mj_kinematics(self.mj_model, d)
        self.home_rotation = jnp.asarray(d.site_xmat[self.index.ee_site].reshape(3, 3))
        self.home_tcp = np.array(d.site_xpos[self.index.ee_site])

    # -- physics parameters --------------------------------------------------------------------
    def model(self, params: ArmParams) -> mjx.Model:
        """The MJX model with the episode parameters written in."""
        m, ix = self.mjx_model, self.index
        h, mass = params.cube_half_size, params.cube_mass
        a = jnp.asarray(ix.arm_act)
        gain = m.actuator_gainprm.at[a, 0].multiply(params.gain_scale)
        bias = m.actuator_biasprm.at[a, 1].multiply(params.gain_scale)
        bias = bias.at[a, 2].multiply(params.gain_scale)
        return m.replace(
            geom_size=m.geom_size.at[ix.cube_geom].set(jnp.stack([h, h, h])),
            geom_rbound=m.geom_rbound.at[ix.cube_geom].set(h * jnp.sqrt(3.0)),
            geom_friction=m.geom_friction.at[ix.cube_geom, 0].set(params.cube_friction),
            body_mass=m.body_mass.at[ix.cube_body].set(mass),
            body_inertia=m.body_inertia.at[ix.cube_body].set(jnp.full(3, mass * (2 * h) ** 2 / 6)),
            actuator_gainprm=gain,
            actuator_biasprm=bias,
        )

    # -- reset -----------------------------------------------------------------------------------
    def reset(self, rng: jax.Array) -> State:
        return self.reset_with_params(rng, self.nominal_params)

    def reset_with_params(
        self, rng: jax.Array, params: ArmParams, cube_offset: jax.Array | None = None
    ) -> State:
        """Initial state with the given parameters; `cube_offset` [3] (dx m, dy m, dyaw rad) shifts
        the sampled cube pose (domain randomization)."""
        cfg, ix = self.config.init, self.index
        k = jax.random.split(rng, 5)
        lo, hi = ix.arm_range[:, 0], ix.arm_range[:, 1]
        noise = jax.random.uniform(k[0], (7,), minval=-cfg.joint_noise, maxval=cfg.joint_noise)
        q_arm = jnp.clip(jnp.asarray(HOME) + noise, lo, hi)
        off = jnp.zeros(3) if cube_offset is None else cube_offset
        u = jax.random.uniform(k[1], (3,), minval=-1.0, maxval=1.0)
        xy = jnp.asarray(cfg.cube_center) + cfg.cube_range * u[:2] + off[:2]
        if self.config.task == "reach":  # the cube waits behind the base, out of the way
            xy = jnp.array([-0.5, 0.0])
        yaw = cfg.cube_yaw * u[2] + off[2]
        h = params.cube_half_size
        cube = jnp.concatenate(
            [xy, h[None], jnp.stack([jnp.cos(yaw / 2), 0.0, 0.0, jnp.sin(yaw / 2)])]
        )
        finger = ix.finger_range[:, 1]
        qpos = self._data0.qpos.at[ix.arm_qpos].set(q_arm).at[ix.finger_qpos].set(finger)
        qpos = qpos.at[ix.cube_qpos : ix.cube_qpos + 7].set(cube)
        goal = self._sample_goal(k[2], h)
        ctrl = self._gripper_ctrl(self._data0.ctrl.at[ix.arm_act].set(q_arm), jnp.ones(()))
        px = self._data0.replace(
            qpos=qpos, ctrl=ctrl, mocap_pos=self._data0.mocap_pos.at[ix.goal_mocap].set(goal)
        )
        # kinematics, not forward: observations and rewards read positions only, and `mjx.step`
        # runs forward itself; a reset with the whole of forward (contacts, constraint solver)
        # took the H200 PPO preset's init 27 s to compile and sits in every auto-reset
        px = _mjx_kinematics(self.model(params), px)
        z = jnp.zeros(())
        data = ArmData(px, params, goal, jnp.zeros(self.action_size), jnp.zeros((), jnp.int32), z)
        terms, _, _ = self._reward(data, data.last_action)
        metrics = {f"reward/{n}": z for n in terms} | {"success": z, "position_error": z}
        info = {"rng": k[3], "progress": jnp.ones(())}
        return State(
            data=data, obs=self._observe(data), reward=z, done=z, metrics=metrics, info=info
        )

    def _sample_goal(self, key: jax.Array, h: jax.Array) -> jax.Array:
        cfg = self.config.init
        if self.config.task == "reach":
            return jax.random.uniform(
                key, (3,), minval=jnp.array(cfg.reach_low), maxval=jnp.array(cfg.reach_high)
            )
        if cfg.goal_targets and self.config.task == "pick_place":
            targets = jnp.asarray(cfg.goal_targets, jnp.float32)
            goal = targets[jax.random.randint(key, (), 0, len(targets))]
            return goal.at[2].add(h)
        u = jax.random.uniform(key, (3,), minval=-1.0, maxval=1.0)
        xy = jnp.asarray(cfg.cube_center) + cfg.goal_range * u[:2]
        lo, hi = cfg.goal_height if self.config.task == "pick_place" else (0.0, 0.0)
        return jnp.concatenate([xy, (h + lo + (hi - lo) * (u[2] + 1) / 2)[None]])

    # -- step ------------------------------------------------------------------------------------
    def step(self, state: State, action: jax.Array) -> State:
        data: ArmData = state.data
        action = jnp.clip(action, -1.0, 1.0)
        mx = self.model(data.params)
        ctrl = self._control(mx, data.physics, action)
        px = jax.lax.fori_loop(
            0, self.substeps, lambda _, d: _mjx_step(mx, d), data.physics.replace(ctrl=ctrl)
        )
        tcp, cube, _ = self._positions(data.replace(physics=px))
        reached = jnp.maximum(data.reached, self._at_cube(tcp, cube))
        ndata = data.replace(physics=px, last_action=action, step=data.step + 1, reached=reached)
        terms, distance, success = self._reward(ndata, data.last_action)
        cube = px.qpos[self.index.cube_qpos : self.index.cube_qpos + 3]
        lost = (cube[2] < -0.1) | (jnp.linalg.norm(cube[:2]) > 1.5)
        finite = jnp.all(jnp.isfinite(px.qpos)) & jnp.all(jnp.isfinite(px.qvel))
        done = (lost | ~finite).astype(jnp.float32)
        metrics = {
            **state.metrics,
            **{f"reward/{n}": v for n, v in terms.items()},
            "success": success,
            "position_error": distance,
        }
        return state.replace(
            data=ndata,
            obs=self._observe(ndata),
            reward=sum(terms.values()),
            done=done,
            metrics=metrics,
        )

    def _gripper_ctrl(self, ctrl: jax.Array, opening: jax.Array) -> jax.Array:
        """Writes the gripper command `opening` ∈ [0, 1] (closed → open) into each gripper
        actuator's control range."""
        rng = self.mj_model.actuator_ctrlrange[self.index.grip_act]
        return ctrl.at[self.index.grip_act].set(rng[:, 0] + opening * (rng[:, 1] - rng[:, 0]))

    def _control(self, mx: mjx.Model, px: mjx.Data, action: jax.Array) -> jax.Array:
        """[nu] new actuator controls (arm joint targets in their limits, gripper)."""
        ix = self.index
        target = px.ctrl[ix.arm_act]
        if self.config.action_space == "joint_delta":
            target = target + self.config.joint_step * action[:7]
        else:
            q = px.qpos[ix.arm_qpos]  # linearized at the measured pose: no target windup
            target = q + self._ik_step(mx, px, q, self.config.ee_step * action[:3])
        target = jnp.clip(target, ix.arm_range[:, 0], ix.arm_range[:, 1])
        return self._gripper_ctrl(px.ctrl.at[ix.arm_act].set(target), (action[-1] + 1.0) / 2.0)

    def _ik_step(self, mx: mjx.Model, px: mjx.Data, q: jax.Array, dpos: jax.Array) -> jax.Array:
        """[7] joint change Δq = Jᵀ(JJᵀ + λ²I)⁻¹ e moving the tool by `dpos` (world, m) from its
        pose at joint targets `q` while turning it back to the home orientation.

        Error: tool position and the small-angle orientation error ½ Σᵢ rᵢ × r̂ᵢ over the columns
        of the tool rotation R (towards the home R̂). Hinge j (world axis aⱼ through anchor pⱼ)
        moves the tool by aⱼ × (x − pⱼ) and turns each column by aⱼ × rᵢ, so the Jacobian's
        columns are those and ½ Σᵢ (aⱼ × rᵢ) × r̂ᵢ (`index_model` checks that every arm joint
        moves the tool; the same J as forward-mode autodiff, without differentiating MJX)."""
        ix = self.index
        kin = _mjx_kinematics(mx, px.replace(qpos=px.qpos.at[ix.arm_qpos].set(q)))
        pos, rot = kin.site_xpos[ix.ee_site], kin.site_xmat[ix.ee_site]
        axis, anchor = kin.xaxis[ix.arm_joint], kin.xanchor[ix.arm_joint]  # [7, 3]
        cols, home = rot.T, self.home_rotation.T  # [3 columns, 3]
        rot_err = 0.5 * jnp.sum(jnp.cross(cols, home), axis=0)
        turn = jnp.cross(axis[:, None, :], cols[None])  # [7, 3 columns, 3]
        jac = jnp.concatenate(
            [jnp.cross(axis, pos - anchor), 0.5 * jnp.sum(jnp.cross(turn, home[None]), axis=1)],
            axis=1,
        ).T  # [6, 7]
        err = jnp.concatenate([dpos, -rot_err])
        lam2 = self.config.ik_damping**2
        return jac.T @ jnp.linalg.solve(jac @ jac.T + lam2 * jnp.eye(6), err)

    # -- observation and reward --------------------------------------------------------------------
    def _positions(self, data: ArmData) -> tuple[jax.Array, jax.Array, jax.Array]:
        px, ix = data.physics, self.index
        return px.site_xpos[ix.ee_site], px.qpos[ix.cube_qpos : ix.cube_qpos + 3], data.goal

    def tracked_position(self, data: ArmData) -> jax.Array:
        """[3] the controlled point (tool for reach, cube otherwise) relative to the goal, m; its
        norm is `metrics["position_error"]` (push: of the horizontal part)."""
        tcp, cube, goal = self._positions(data)
        return (tcp if self.config.task == "reach" else cube) - goal

    def _observe(self, data: ArmData) -> dict[str, jax.Array]:
        px, ix = data.physics, self.index
        tcp, cube, goal = self._positions(data)
        state = jnp.concatenate(
            [
                px.qpos[ix.arm_qpos],
                px.qvel[ix.arm_dof],
                px.qpos[ix.finger_qpos],
                tcp,
                cube,
                px.qpos[ix.cube_qpos + 3 : ix.cube_qpos + 7],
                goal,
                cube - tcp,
                goal - cube,
                goal - tcp,
                data.last_action,
            ]
        )
        cube_vel = px.qvel[ix.cube_dof : ix.cube_dof + 6]
        return {
            "state": state,
            "privileged_state": jnp.concatenate([state, cube_vel, data.params.as_vector()]),
        }

    def _at_cube(self, tcp: jax.Array, cube: jax.Array) -> jax.Array:
        """1.0 while the tool centre point is within `reach_radius` of the cube, else 0.0."""
        return (jnp.linalg.norm(cube - tcp) < self.config.reward.reach_radius).astype(jnp.float32)

    def _reward(
        self, data: ArmData, prev_action: jax.Array
    ) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
        """(terms, controlled distance [m], success ∈ {0, 1})."""
        c, task = self.config.reward, self.config.task
        tcp, cube, goal = self._positions(data)

        def shaped(d):
            return 1.0 - jnp.tanh(d / c.distance_scale)

        terms = {}
        if task == "reach":
            distance = jnp.linalg.norm(goal - tcp)
            terms["reach"] = c.reach * shaped(distance)
        else:
            terms["reach"] = c.reach * shaped(jnp.linalg.norm(cube - tcp))
            if task == "push":
                distance = jnp.linalg.norm(goal[:2] - cube[:2])
            else:
                distance = jnp.linalg.norm(goal - cube)
                closed = (1.0 - data.last_action[-1]) / 2.0
                terms["grasp"] = c.grasp * self._at_cube(tcp, cube) * closed
                height = cube[2] - data.params.cube_half_size
                terms["lift"] = c.lift * jnp.clip(height / c.lift_height, 0.0, 1.0)
            terms["goal"] = c.goal * shaped(distance) * data.reached
        success = (distance < self.config.success_threshold).astype(jnp.float32)
        terms["success"] = c.success * success
        terms["action_rate"] = -c.action_rate * jnp.sum((data.last_action - prev_action) ** 2)
        return terms, distance, success

    # -- contract ----------------------------------------------------------------------------------
    @property
    def observation_size(self) -> dict[str, tuple[int, ...]]:
        n = sum(size for _, size in obs_fields(self.action_size))
        return {"state": (n,), "privileged_state": (n + 6 + 10,)}

    @property
    def action_size(self) -> int:
        return 8 if self.config.action_space == "joint_delta" else 4

    @property
    def default_action(self) -> jax.Array:
        """Hold the joints, gripper open."""
        return jnp.zeros(self.action_size).at[-1].set(1.0)

    @property
    def dt(self) -> float:
        return self.config.ctrl_dt

    @property
    def compiler_options(self) -> dict[str, bool]:
        """XLA:CPU's fusion emitters make MJX kinematics exponentially slow in the kinematic-tree
        depth (jax-ml/jax#33761, google-deepmind/mujoco#2957: a 7-DoF arm step ~300× slower
        under vmap); they are turned off for compiles of this env on the CPU only (they speed
        the quadrotor up 2.5×, so not process-wide). So are multi-threaded Eigen matmuls: with
        SAC's 256-256 critic, runs on the 2-core CPU hung in them twice out of four (every XLA
        thread idle, the host waiting for the update's buffers), the intra-op pool wedge that
        `--xla_cpu_multi_thread_eigen=false` avoids."""
        if jax.default_backend() != "cpu":
            return {}
        return {"xla_cpu_use_fusion_emitters": False, "xla_cpu_multi_thread_eigen": False}


__all__ = [
    "HOME",
    "ArmConfig",
    "ArmData",
    "ArmEnv",
    "ArmParams",
    "InitConfig",
    "RewardConfig",
    "obs_fields",
]
