"""A scripted pick-and-place policy for `arm-pick-place` with Cartesian actions (a base policy for
residual RL and a classical baseline).

A phase machine over the actor observation (layout `sim.manipulator.obs_fields`), the way a
classical pipeline picks an object: detect the cube once, then execute waypoints planned from that
detection:

    DETECT → APPROACH (hover above the cube, open) → DESCEND (tool centre point at the cube centre)
    → CLOSE (for `close_steps`; the in-hand offset cube − tool is measured once at the end)
    → LIFT (straight up) → CARRY (cube to the goal, held there)

Pick-place success is the 3-D cube–goal distance at the end of the episode, so the cube is held
at the goal rather than released (goals lie up to 0.2 m above the table).

Each phase steers the tool towards its waypoint p* with a PI law on the measured tool position,
a = k_p·e + k_i·Σe with e = p* − p_tcp, its norm capped at `max_speed` (one action unit moves the
tool target by `ArmConfig.ee_step` m from the measured pose). The env re-linearizes the IK at the
measured joints every step and the servos have no gravity compensation, so a zero action lets the
arm sink and a P law alone stops centimetres short; the integral (summed only while the law is not
saturated, and bounded) removes that offset. It also back-calculates from the applied action (the
observation's `last_action`): a correction added to the command by a residual policy moves the
integral along with it, so the base yields to the correction rather than winding up against it.

Brittleness, on purpose (it is the base a residual policy corrects): the grasp waypoints come from
the first detection (`track_cube=False`) and the in-hand offset from one detection, so the policy
works on nominal scenes but misses when a detection is off or the cube is pushed after it; it does
not check the grasp and never re-grasps. Phase changes look at the tool's progress or at a timeout
only, so they still happen when a residual policy moves the tool off the base's waypoints.

`resume(obs)` takes over an episode that another policy started (DAgger-style collection): from
CARRY, with the in-hand offset measured there, when the cube is held, else from the start (detect,
approach, grasp: a re-grasp from wherever the tool is).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from sim.manipulator.env import ArmEnv, obs_fields

DETECT, APPROACH, DESCEND, CLOSE, LIFT, CARRY = range(6)
PHASES = ("detect", "approach", "descend", "close", "lift", "carry")
"""Phase names, indexed by `ScriptedState.phase`."""


@dataclasses.dataclass(frozen=True)
class ScriptedConfig:
    """Waypoints, gains and phase timing of the scripted pick-and-place policy."""

    gain: float = 15.0
    """Proportional gain from tool position error to action, 1/m."""
    integral_gain: float = 1.0
    """Gain on the summed tool position error, 1/(m·step)."""
    integral_limit: float = 1.0
    """Bound on the integral term per axis, action units."""
    yield_gain: float = 0.2
    """Back-calculation gain: each step the integral moves by this times (applied action − own
    command), read from the observation's `last_action`, so the policy yields to a correction
    added to its command (a residual policy) instead of winding up against it."""
    max_speed: float = 1.0
    """Largest norm of the Cartesian action (× `ArmConfig.ee_step` m per control step)."""
    hover_height: float = 0.08
    """Height of the approach waypoint above the detected cube centre, m."""
    grasp_height: float = 0.0
    """Height of the tool centre point above the detected cube centre at the grasp, m."""
    lift_height: float = 0.12
    """Height of the lift waypoint above the detected cube centre, m."""
    xy_tolerance: float = 0.01
    """Horizontal tool error that ends APPROACH, m."""
    z_tolerance: float = 0.01
    """Vertical tool error that ends APPROACH, DESCEND and LIFT, m."""
    close_steps: int = 15
    """Control steps the gripper closes for before LIFT."""
    timeout_steps: int = 80
    """Steps after which APPROACH, DESCEND or LIFT end regardless of the tool's progress."""
    track_cube: bool = False
    """Re-read the cube position every step until the gripper closes, and the in-hand offset
    every step while carrying (closed loop), instead of one detection each."""
    hold_radius: float = 0.03
    """`resume` counts the cube as held when the gripper was commanded closed (the observation's
    `last_action`) and the tool centre point is within this distance of the cube centre, m."""

    def validate(self) -> None:
        positive = ("gain", "max_speed", "xy_tolerance", "z_tolerance", "hold_radius")
        bad = [name for name in positive if not getattr(self, name) > 0]
        if bad:
            raise ValueError(f"scripted {', '.join(bad)} must be > 0")
        if min(self.integral_gain, self.integral_limit, self.yield_gain) < 0:
            raise ValueError("scripted integral_gain, integral_limit, yield_gain must be ≥ 0")
        if self.close_steps < 1 or self.timeout_steps < 1:
            raise ValueError("scripted close_steps and timeout_steps must be ≥ 1")


@struct.dataclass
class ScriptedState:
    """phase: [] int32 index into `PHASES`. timer: [] int32 steps spent in the phase.
    cube: [3] world, m, the detected cube position the grasp waypoints are planned from.
    offset: [3] world, m, the in-hand offset cube − tool measured at the end of CLOSE.
    integral: [3] world, action units, the integral term k_i·Σe (with back-calculation).
    command: [3] world, action units, the Cartesian command of the previous step."""

    phase: jax.Array
    timer: jax.Array
    cube: jax.Array
    offset: jax.Array
    integral: jax.Array
    command: jax.Array


class ScriptedPolicy(NamedTuple):
    """Pure functions of the scripted policy (the base-policy interface of `algos.residual`).

    init() -> ScriptedState (phase DETECT, at the start of each episode)
    apply(obs [obs_size], state) -> (action [4] in [-1, 1], state)  (unbatched; vmap for batches)
    obs_size: the actor observation size it reads.
    resume(obs [obs_size]) -> ScriptedState, to take over an episode in mid-course: CARRY with the
    in-hand offset of `obs` if the cube is held (`ScriptedConfig.hold_radius`), else `init()`.
    """

    init: Callable[[], ScriptedState]
    apply: Callable[[jax.Array, ScriptedState], tuple[jax.Array, ScriptedState]]
    obs_size: int
    resume: Callable[[jax.Array], ScriptedState]


def make_scripted_policy(cfg: ScriptedConfig = ScriptedConfig()) -> ScriptedPolicy:
    """The scripted pick-and-place policy for the Cartesian action space (action size 4)."""
    cfg.validate()
    layout, start = {}, 0
    for name, size in obs_fields(4):
        layout[name] = slice(start, start + size)
        start += size
    up = jnp.array([0.0, 0.0, 1.0])

    def init() -> ScriptedState:
        z = jnp.zeros((), jnp.int32)
        return ScriptedState(z, z, jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), jnp.zeros(3))

    def apply(obs: jax.Array, s: ScriptedState) -> tuple[jax.Array, ScriptedState]:
        tcp, seen, goal = obs[layout["tcp_pos"]], obs[layout["cube_pos"]], obs[layout["goal_pos"]]
        first = s.phase == DETECT
        phase = jnp.maximum(s.phase, APPROACH)
        cube = jnp.where(first | (cfg.track_cube & (phase < CLOSE)), seen, s.cube)
        measure = (phase == CLOSE) | (cfg.track_cube & (phase == CARRY))
        offset = jnp.where(measure, seen - tcp, s.offset)
        # waypoint of the tool and gripper command (1 open, −1 closed) per phase
        grasp = cube + cfg.grasp_height * up
        waypoints = jnp.stack(
            [
                grasp,
                cube + cfg.hover_height * up,
                grasp,
                grasp,
                cube + cfg.lift_height * up,
                goal - offset,
            ]
        )
        grips = jnp.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
        err = waypoints[phase] - tcp
        p_term = cfg.gain * err
        # integrate only while the P term is not saturated (anti-windup), bounded
        correction = obs[layout["last_action"]][:3] - s.command  # 0 when acting alone
        integral = s.integral + cfg.integral_gain * err + cfg.yield_gain * correction
        integral = jnp.clip(integral, -cfg.integral_limit, cfg.integral_limit)
        integral = jnp.where(jnp.linalg.norm(p_term) < cfg.max_speed, integral, s.integral)
        step = p_term + integral
        step = step * jnp.minimum(1.0, cfg.max_speed / (jnp.linalg.norm(step) + 1e-9))
        action = jnp.concatenate([step, grips[phase, None]])
        # phase changes: on the tool's progress, or after a timeout
        xy_ok = jnp.linalg.norm(err[:2]) < cfg.xy_tolerance
        z_ok = jnp.abs(err[2]) < cfg.z_tolerance
        closed = s.timer + 1 >= cfg.close_steps
        arrived = jnp.stack([False, xy_ok & z_ok, z_ok, closed, z_ok, False])[phase]
        timed_out = (s.timer + 1 >= cfg.timeout_steps) & (phase != CLOSE) & (phase != CARRY)
        advance = arrived | timed_out
        nxt = ScriptedState(
            phase=jnp.where(advance, phase + 1, phase).astype(jnp.int32),
            timer=jnp.where(advance, 0, s.timer + 1).astype(jnp.int32),
            cube=cube,
            offset=offset,
            integral=integral,
            command=step,
        )
        return jnp.clip(action, -1.0, 1.0), nxt

    def resume(obs: jax.Array) -> ScriptedState:
        tcp, seen = obs[layout["tcp_pos"]], obs[layout["cube_pos"]]
        closed = obs[layout["last_action"]][3] < 0
        held = closed & (jnp.linalg.norm(seen - tcp) < cfg.hold_radius)
        s = init()
        return s.replace(
            phase=jnp.where(held, CARRY, DETECT).astype(jnp.int32),
            cube=jnp.where(held, seen, s.cube),
            offset=jnp.where(held, seen - tcp, s.offset),
        )

    return ScriptedPolicy(init, apply, sum(size for _, size in obs_fields(4)), resume)


def make_scripted_base(env: ArmEnv, cfg: ScriptedConfig = ScriptedConfig()) -> ScriptedPolicy:
    """The scripted policy for `env` (an unwrapped `ArmEnv`; pick-place, cartesian actions).

    Raises `ValueError` for another action space or task."""
    c = env.config
    if c.action_space != "cartesian":
        raise ValueError(f"the scripted policy needs cartesian actions, not {c.action_space!r}")
    if c.task != "pick_place":
        raise ValueError(f"the scripted policy picks and places, not {c.task!r}")
    return make_scripted_policy(cfg)


__all__ = [
    "PHASES",
    "ScriptedConfig",
    "ScriptedPolicy",
    "ScriptedState",
    "make_scripted_base",
    "make_scripted_policy",
]
