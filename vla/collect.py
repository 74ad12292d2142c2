"""Demonstrations for VLA training: the scripted pick-and-place expert
(`sim.manipulator.make_scripted_base`), or a VLA with its trained residual (`CollectConfig.expert`),
run batched on MJX, its trajectories rendered from the cameras with C MuJoCo
(`sim.manipulator.render`), written as a LeRobotDataset (`vla.dataset`).

Each episode gets a language instruction from its variant: the cube's colour (set on the rendered
cube geom only; physics is unaffected) and the goal's region on the table,
"pick up the <colour> cube and place it on the <region> target". By default (`goals="targets"`)
the goal is one of four fixed targets (`TARGETS`), one per region, so the instruction names the
goal exactly; with `goals="random"` it names only the region of a random goal, and the rest
must be read from the goal marker in the images. Regions are named from the
robot's point of view (world frame, base at the origin facing +x): the goal's offset from the
centre of the cube's start area along its larger axis, "front" (+x, away from the base), "back"
(−x), "left" (+y) or "right" (−y). In the front camera, which faces the robot, the robot's left is
the image's right.

Frames (one per control step t = 0 … T − 1, at 1 / env.dt = 50 frames/s):
- `observation.state` [12] float32: proprioception the VLA sees, from the actor observation
  (with the domain randomization's sensor noise): arm joint positions [7] (rad), finger
  openings [2] (m), tool-centre-point position [3] (world, m).
- `observation.environment_state` [42] float32: the whole actor observation (layout
  `sim.manipulator.obs_fields(4)`: cube and goal positions, ...), for state-based learners.
- `observation.images.<camera>` [H, W, 3] uint8: the scene before action t.
- `action` [4] float32 in [−1, 1]: the Cartesian action applied at t. Components 0–2 are DELTAS:
  the tool-centre-point target moves by `ArmConfig.ee_step` (0.01 m) × a along world x, y, z
  from the measured pose; component 3 is the ABSOLUTE gripper command (−1 closed … 1 open).
- `next.reward` [1] float32, `next.success` [1] bool (cube within the success threshold of the
  goal after the action), `next.done` [1] bool (the episode's last frame).

An episode ends `hold_steps` steps after its first success, else after `max_steps` steps (or at a
termination). Per-episode metadata (columns of meta/episodes): `success` (at the last frame),
`reset_seed` (the episode is `env.reset(jax.random.key(reset_seed))` of the env the config in
meta/info.json ["hoverfly"] rebuilds, followed by the expert: reproducible), `colour`,
`goal_region`, `goal` [3] (world, m), `cube_half_size` (m), `attempt` (rollout number).
meta/info.json ["hoverfly"]["expert"] counts the expert's rollouts and successes per goal region
(all rollouts, recorded or not): the variants the recorded successes under-represent.

With a `student` (DAgger-style data) the student drives from the reset until the expert takes
over at step `takeover` (metadata); the episode's frames are the expert's, from that step on,
and the expert's counts are over the rollouts it took over.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from algos.residual import field_layout
from sim import make_env
from sim.env import Env
from sim.manipulator import (
    ArmConfig,
    CameraRenderer,
    InitConfig,
    RandomizationConfig,
    ScriptedConfig,
    make_scripted_base,
    obs_fields,
    setup_gl,
)

COLOURS = {
    "red": (0.8, 0.15, 0.1, 1.0),
    "green": (0.15, 0.7, 0.15, 1.0),
    "blue": (0.1, 0.25, 0.85, 1.0),
    "yellow": (0.9, 0.8, 0.1, 1.0),
}
"""Cube colours of the instructions, RGBA in [0, 1]."""
REGIONS = ("front", "back", "left", "right")
"""The goal regions an instruction names (`goal_region`), in the order of `TARGETS`."""
TARGETS = (
    (0.6, 0.0, 0.1),
    (0.35, 0.0, 0.1),
    (0.5, 0.15, 0.1),
    (0.5, -0.15, 0.1),
)
"""The named goal targets (`CollectConfig.goals = "targets"`): front, back, left and right of the
cube's start area, 0.1 m above the resting cube: (x, y, height), m. Back, left and right lie
0.15 m from the area's centre, front 0.1 m: at 0.15 m (x = 0.65 m, near full extension) the
arm's servos, which have no gravity compensation, sag under the cube, and the scripted expert
reached it in 42 % of 64 randomized episodes (98 % at x = 0.62 m, 100 % at 0.6 m)."""
STATE_FIELDS = ("joint_pos", "finger_pos", "tcp_pos")
"""Fields of the actor observation that form `observation.state`, in order."""
ACTION_NAMES = ("tcp_dx", "tcp_dy", "tcp_dz", "gripper")
FAST_COMPILE = {"xla_backend_optimization_level": 0}
"""XLA options for quick compiles of small collections (tests): ~35 % less compile time for a
~2× slower rollout."""


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    """What to collect and how."""

    task: str = "arm-pick-place"
    """Registered task; the scripted expert needs pick-and-place (Cartesian actions)."""
    episodes: int = 100
    """Episodes to record."""
    seed: int = 0
    """Seed of the episodes' reset seeds and colours."""
    image_size: tuple[int, int] = (96, 96)
    """(height, width) of each camera image, px (even, for H.264)."""
    cameras: tuple[str, ...] = ("front", "wrist")
    """Scene cameras to record."""
    image_dtype: Literal["video", "image"] = "video"
    """Store images as H.264 mp4 (lossy, small) or PNG in the parquet files (lossless)."""
    max_steps: int = 250
    """Longest episode, control steps."""
    hold_steps: int = 10
    """Steps recorded after the first success (the cube held at the goal), then the episode ends."""
    keep_failures: bool = False
    """Record unsuccessful episodes too (their `success` is False)."""
    batch_size: int = 32
    """Episodes simulated at once (vmap); a failed episode is replaced from the next batch."""
    max_attempts: int | None = None
    """Give up after this many rollouts (default: 4 × episodes + batch_size)."""
    goals: Literal["targets", "random"] = "targets"
    """Goals: one of the four named `TARGETS`, so the instruction's region names the goal
    exactly, or anywhere in the env's random goal box (the instruction names only its region;
    the rest must be read from the goal marker in the images)."""
    randomize: bool = True
    """Domain randomization (cube size, mass, friction, servo gains, sensor noise)."""
    colours: tuple[str, ...] = tuple(COLOURS)
    """Cube colours, cycled over the recorded episodes."""
    shadows: bool = False
    """Render shadows (about 5× slower in software OpenGL)."""
    wrist_camera: Literal["down", "forward"] = "down"
    """The wrist camera of the recorded images (`sim.manipulator.model.WRIST_CAMERAS`); policies
    trained on the dataset see it in the simulator too. Rendering only: a VLA expert keeps its
    own, and the same seed and settings on the same machine record the same episodes."""
    expert: str = "scripted"
    """"scripted" (`sim.manipulator.make_scripted_base`), or a `hoverfly vla residual` run folder:
    its frozen VLA plus its trained residual (`vla.residual.make_expert_rollout`), so that a VLA
    learns what RL made of it (distillation of an RL policy into the generalist: Xu et al.,
    "RLDG", 2024). The run's arm settings must be the ones this config gives."""
    student: str | None = None
    """A VLA checkpoint (an SFT run's checkpoint folder) that drives each episode until the
    expert takes over at a step drawn from `takeover`, from the student's state (the scripted
    expert resuming, `ScriptedPolicy.resume`; a residual run's base planning at once); only the
    expert's part is recorded. The VLA then learns the expert's recoveries from the states it
    reaches itself (DAgger: Ross et al., 2011; the expert taking over, as in HG-DAgger: Kelly et
    al., 2019). Episodes the student finishes or ends before the takeover are not recorded."""
    takeover: tuple[int, int] = (0, 100)
    """First and last takeover step (uniform per episode, from its reset seed), with `student`."""

    def validate(self) -> None:
        if self.task != "arm-pick-place":
            raise ValueError(f"the scripted expert picks and places; task {self.task!r}")
        if self.episodes < 1 or self.batch_size < 1 or self.max_steps < 1 or self.hold_steps < 0:
            raise ValueError("episodes, batch_size, max_steps must be ≥ 1 and hold_steps ≥ 0")
        unknown = [c for c in self.colours if c not in COLOURS]
        if unknown or not self.colours:
            raise ValueError(f"unknown colours {unknown or self.colours}; known: {list(COLOURS)}")
        if self.goals not in ("targets", "random"):
            raise ValueError(f"goals must be 'targets' or 'random', got {self.goals!r}")
        if self.image_dtype == "video" and any(s % 2 for s in self.image_size):
            raise ValueError(f"video images need an even size, got {self.image_size}")
        if self.expert != "scripted" and not (Path(self.expert) / "config.json").is_file():
            raise ValueError(f"expert: {self.expert!r} is neither 'scripted' nor a run folder")
        lo, hi = self.takeover
        if self.student is not None and not 0 <= lo <= hi < self.max_steps:
            raise ValueError(f"takeover: 0 ≤ first ≤ last < max_steps, got {self.takeover}")


def collect_config_from_info(env_info: dict[str, Any] | None) -> CollectConfig:
    """The collect settings of a dataset's meta/info.json "hoverfly" section (as a checkpoint's
    train_state keeps it): the env its episodes ran in. Settings added after a dataset was
    written take their defaults, except `goals`: datasets from before the named targets had
    random goals. Raises `DatasetError` when there are none."""
    from vla.dataset import DatasetError

    if not isinstance(env_info, dict) or "collect" not in env_info:
        raise DatasetError('meta/info.json: hoverfly: no "collect" settings to rebuild the env')
    raw = dict(env_info["collect"])
    raw.setdefault("goals", "random")
    names = {f.name for f in dataclasses.fields(CollectConfig)}
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in names}
    return CollectConfig(**kwargs)


def collect_arm_config(config: CollectConfig) -> ArmConfig:
    """The arm settings of the demonstrations' env (pick-place, Cartesian actions, the goals):
    every env a policy trained on them runs in (closed-loop evaluation, RL, the residual's base)
    is built from these."""
    targets = TARGETS if config.goals == "targets" else ()
    return ArmConfig(
        task="pick_place",
        action_space="cartesian",
        episode_steps=config.max_steps,
        init=InitConfig(goal_targets=targets),
    )


def make_collect_env(config: CollectConfig) -> Env:
    """The env the demonstrations run in (`collect_arm_config`, randomized unless turned off)."""
    randomization = RandomizationConfig() if config.randomize else None
    return make_env(config.task, collect_arm_config(config), randomization)


def goal_region(goal_xy: np.ndarray, center: tuple[float, float]) -> str:
    """The goal's region, one of front/back/left/right: the larger axis of its offset [2]
    (world, m) from `center`, from the robot's point of view (+x front, +y left)."""
    dx, dy = np.asarray(goal_xy, np.float64) - np.asarray(center)
    if abs(dx) >= abs(dy):
        return "front" if dx >= 0 else "back"
    return "left" if dy >= 0 else "right"


def instruction(colour: str, region: str) -> str:
    """The episode's language instruction."""
    return f"pick up the {colour} cube and place it on the {region} target"


_PER_STEP = ("obs", "qpos", "mocap_pos", "action", "reward", "success", "done")
"""The rollouts' per-step outputs [T, B, ...]; the others are per episode [B, ...]."""


def make_rollout(
    env: Env,
    max_steps: int,
    student: str | None = None,
    takeover: tuple[int, int] = (0, 0),
    scripted: ScriptedConfig | None = None,
):
    """rollout(reset_seeds [B] uint32) -> trajectories of the scripted expert (host-side use):
    obs [T, B, O] and qpos [T, B, nq], mocap_pos [T, B, nmocap, 3] before action t; action
    [T, B, 4]; reward, success, done [T, B] after it; cube_half_size [B] (m), goal [B, 3] (m);
    takeover [B] (int32, the expert's first step). With a `student` (a VLA checkpoint,
    `vla.residual.make_student_driver`) the student drives until the takeover step and the
    expert resumes there (`ScriptedPolicy.resume`: it carries a cube the student holds to the
    goal, else it starts from its first phase). `scripted`: the expert's settings (default
    `ScriptedConfig()`). Pure; jit it at the edge with `compiler_options=env.compiler_options`."""
    base = make_scripted_base(env.unwrapped, scripted or ScriptedConfig())
    driver = None
    if student is not None:
        from vla.residual import make_student_driver  # torch: only with a student

        driver = make_student_driver(student, env, takeover)

    def rollout(seeds: jax.Array) -> dict[str, jax.Array]:
        state = jax.vmap(env.reset)(jax.vmap(jax.random.key)(seeds))
        fresh = jax.vmap(lambda _: base.init())(seeds)
        if driver is None:
            drive, first = (), jnp.zeros(seeds.shape, jnp.int32)
        else:
            drive, first = jax.vmap(driver.init)(seeds, state)

        def step(c, t):
            state, carry, drive = c
            obs = state.obs["state"]
            if driver is not None:  # the expert resumes from the state at its takeover step
                now = t == first
                carry = jax.tree.map(
                    lambda r, c: jnp.where(now.reshape(-1, *[1] * (c.ndim - 1)), r, c),
                    jax.vmap(base.resume)(obs),
                    carry,
                )
            action, carry = jax.vmap(base.apply)(obs, carry)
            if driver is not None:
                act = jax.vmap(driver.act, (0, 0, 0, 0, None))
                driving, student_action, drive = act(obs, state, drive, first, t)
                action = jnp.where(driving[:, None], student_action, action)
            nstate = jax.vmap(env.step)(state, action)
            px = state.data.physics
            out = {
                "obs": obs,
                "qpos": px.qpos,
                "mocap_pos": px.mocap_pos,
                "action": jnp.clip(action, -1.0, 1.0),
                "reward": nstate.reward,
                "success": nstate.metrics["success"],
                "done": nstate.done,
            }
            return (nstate, carry, drive), out

        _, traj = jax.lax.scan(step, (state, fresh, drive), jnp.arange(max_steps))
        data = state.data
        return traj | {
            "cube_half_size": data.params.cube_half_size,
            "goal": data.goal,
            "takeover": first,
        }

    return rollout


def episode_length(success: np.ndarray, done: np.ndarray, hold_steps: int) -> int:
    """Recorded length of one episode from success, done [T] (after each step): up to
    `hold_steps` steps after the first success, the first termination, or T."""
    t = len(success)
    first = np.flatnonzero(success > 0)
    end = t if len(first) == 0 else min(t, first[0] + 1 + hold_steps)
    dead = np.flatnonzero(done[:end] > 0)
    return int(dead[0] + 1) if len(dead) else int(end)


def _batches(
    config: CollectConfig, run, rng: np.random.Generator, max_attempts: int
) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
    """Yields (attempt, reset_seed, one episode's host trajectory) until `max_attempts`."""
    attempt = 0
    while attempt < max_attempts:
        seeds = rng.integers(0, 2**31 - 1, size=config.batch_size, dtype=np.uint32)
        traj = jax.device_get(run(jnp.asarray(seeds)))
        for b in range(config.batch_size):
            if attempt >= max_attempts:
                return
            ep = {k: v[:, b] if k in _PER_STEP else v[b] for k, v in traj.items()}
            yield attempt, seeds[b], ep
            attempt += 1


def _features(config: CollectConfig) -> dict[str, dict]:
    from vla.dataset_writer import make_features  # pyarrow: only where a dataset is written

    sizes = dict(obs_fields(4))
    state_names = [f"{f}_{i}" for f in STATE_FIELDS for i in range(sizes[f])]
    env_names = [f"{f}_{i}" for f, n in obs_fields(4) for i in range(n)]
    flag = {"dtype": "bool", "shape": [1], "names": None}
    extra = {
        "observation.environment_state": {
            "dtype": "float32",
            "shape": [len(env_names)],
            "names": env_names,
        },
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.success": flag,
        "next.done": dict(flag),
    }
    cams = {c: tuple(config.image_size) for c in config.cameras}
    return make_features(state_names, ACTION_NAMES, cams, config.image_dtype, extra)


def state_index(fields: Sequence[str] = STATE_FIELDS, action_size: int = 4) -> np.ndarray:
    """Indices into the arm's `obs["state"]` of the named fields (`obs_fields`), in order: the
    VLA state vector is `obs["state"][..., state_index()]`."""
    layout = field_layout(obs_fields(action_size))
    return np.concatenate([np.arange(*layout[f]) for f in fields])


def _frames(
    ep: dict[str, np.ndarray], length: int, images: np.ndarray, config: CollectConfig
) -> dict[str, np.ndarray]:
    """The dataset frames of one episode from its trajectory and images [T, H, W · cams, 3]."""
    w = config.image_size[1]
    obs = ep["obs"][:length].astype(np.float32)
    done = np.zeros(length, bool)
    done[-1] = True
    frames = {
        "observation.state": obs[:, state_index()],
        "observation.environment_state": obs,
        "action": ep["action"][:length].astype(np.float32),
        "next.reward": ep["reward"][:length].astype(np.float32),
        "next.success": ep["success"][:length] > 0,
        "next.done": done,
    }
    for i, cam in enumerate(config.cameras):
        frames[f"observation.images.{cam}"] = images[..., i * w : (i + 1) * w, :]
    return frames


def _compiled_rollout(config: CollectConfig, options: tuple) -> tuple[Env, Any]:
    """(env, jitted rollout of the config's expert), one per setting in a process, so repeated
    collects reuse the compiled executable (~30–60 s to compile on a 2-core CPU)."""
    expert = config.expert if config.expert == "scripted" else str(Path(config.expert).resolve())
    student = config.student and str(Path(config.student).resolve())
    takeover = config.takeover if student else (0, 0)
    return _compiled(
        config.randomize, config.max_steps, config.goals, expert, student, takeover, options
    )


@functools.cache
def _compiled(
    randomize: bool,
    max_steps: int,
    goals: str,
    expert: str,
    student: str | None,
    takeover: tuple[int, int],
    options: tuple,
) -> tuple[Env, Any]:
    config = CollectConfig(randomize=randomize, max_steps=max_steps, goals=goals)
    if expert == "scripted":
        env = make_collect_env(config)
        run = make_rollout(env, max_steps, student, takeover)
    else:
        from vla.residual import make_expert_rollout  # torch: only for a VLA expert

        env, run = make_expert_rollout(expert, max_steps, student, takeover)
        arm = env.unwrapped.config
        if arm != collect_arm_config(config) or not randomize:
            raise ValueError(
                f"{expert}: the expert run's arm settings (goal targets {arm.init.goal_targets}, "
                f"{arm.episode_steps} steps, randomized) differ from the collect config's "
                f"(goals {goals!r}, max_steps {max_steps}, randomize {randomize})"
            )
    return env, jax.jit(run, compiler_options=env.compiler_options | dict(options))


def rollout_episodes(
    config: CollectConfig, reset_seeds: np.ndarray, compiler_options: dict | None = None
) -> dict[str, np.ndarray]:
    """Host trajectories (see `make_rollout`) of the expert from `reset_seeds` [N] (N ≤
    `config.batch_size`; padded to it, so the compiled rollout of `collect` is reused): replays
    recorded episodes from their `reset_seed`."""
    seeds = np.asarray(reset_seeds, np.uint32).reshape(-1)
    if not 0 < len(seeds) <= config.batch_size:
        raise ValueError(f"1 … batch_size = {config.batch_size} seeds, got {len(seeds)}")
    options = tuple(sorted((compiler_options or {}).items()))
    _, run = _compiled_rollout(config, options)
    padded = np.resize(seeds, config.batch_size)
    traj = jax.device_get(run(jnp.asarray(padded)))
    n = len(seeds)
    return {k: v[:, :n] if k in _PER_STEP else v[:n] for k, v in traj.items()}


def collect(
    out: str | Path,
    config: CollectConfig | None = None,
    overwrite: bool = False,
    progress: bool = True,
    compiler_options: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """Collects `config.episodes` demonstrations (see the module docstring) into the dataset
    folder `out` (written atomically; an existing non-empty `out` needs `overwrite`). Fields of
    `config` may be given as keyword overrides: `collect(out, episodes=50, seed=1)`.
    `compiler_options` are added to the env's for the rollout's jit. Returns `out`.

    Raises `RuntimeError` when `max_attempts` rollouts give too few successful episodes."""
    from vla.dataset_writer import Writer

    config = dataclasses.replace(config or CollectConfig(), **overrides)
    config.validate()
    if config.expert != "scripted":
        config = dataclasses.replace(config, expert=str(Path(config.expert).resolve()))
    setup_gl()  # probes EGL in a child process: before JAX starts its threads
    options = tuple(sorted((compiler_options or {}).items()))
    env, run = _compiled_rollout(config, options)
    arm = env.unwrapped
    fps = round(1.0 / env.dt)
    max_attempts = config.max_attempts or 4 * config.episodes + config.batch_size
    rng = np.random.default_rng(config.seed)
    info = {"hoverfly": {"collect": dataclasses.asdict(config), "state_fields": STATE_FIELDS}}
    h, w = config.image_size
    bar = _progress(progress, config.episodes)
    with (
        CameraRenderer(env, config.cameras, h, w, config.wrist_camera) as renderer,
        Writer(out, _features(config), fps, "franka_panda", overwrite, info=info) as writer,
        bar,
    ):
        if not config.shadows:
            renderer.model.light_castshadow[:] = 0
        task_id = bar.add_task("collecting", total=config.episodes)
        expert = {r: {"rollouts": 0, "successes": 0} for r in REGIONS}
        writer.info["hoverfly"]["expert"] = expert
        for attempt, seed, ep in _batches(config, run, rng, max_attempts):
            length = episode_length(ep["success"], ep["done"], config.hold_steps)
            first = int(ep["takeover"])  # the expert's first step (0 without a student)
            if first >= length or ep["success"][:first].any():
                continue  # the student finished or ended the episode: the expert never drove
            ep = {k: v[first:] if k in _PER_STEP else v for k, v in ep.items()}
            length -= first
            success = bool(ep["success"][length - 1] > 0)
            region = goal_region(ep["goal"][:2], arm.config.init.cube_center)
            expert[region]["rollouts"] += 1
            expert[region]["successes"] += success
            successes = sum(n["successes"] for n in expert.values())
            bar.update(task_id, description=f"collecting ({successes}/{attempt + 1} succeed)")
            if not (success or config.keep_failures):
                continue
            colour = config.colours[writer.num_episodes % len(config.colours)]
            renderer.model.geom_rgba[arm.index.cube_geom] = COLOURS[colour]
            images = renderer.render(
                ep["qpos"][:length], ep["mocap_pos"][:length], ep["cube_half_size"]
            )
            metadata = {
                "success": success,
                "reset_seed": int(seed),
                "colour": colour,
                "goal_region": region,
                "goal": [float(x) for x in ep["goal"]],
                "cube_half_size": float(ep["cube_half_size"]),
                "attempt": attempt,
            } | ({"takeover": first} if config.student else {})
            writer.add_episode(
                _frames(ep, length, images, config), instruction(colour, region), metadata
            )
            bar.advance(task_id)
            if writer.num_episodes == config.episodes:
                break
        else:
            raise RuntimeError(
                f"only {writer.num_episodes} of {config.episodes} episodes after {max_attempts} "
                f"rollouts ({successes} successful); raise max_attempts or keep_failures"
            )
    return Path(out)


def _progress(enabled: bool, total: int):
    """A rich progress bar on stderr (a disabled one when `enabled` is False)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns, console=Console(stderr=True), disable=not enabled)


def make_test_dataset(
    out: str | Path,
    episodes: int = 3,
    image_size: tuple[int, int] = (32, 32),
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """A small dataset quickly, for tests: `episodes` successful demonstrations with
    `image_size` images, one batch of `episodes + 1` rollouts at a time. Compiled as
    `hoverfly vla collect` compiles, so the command run in the same process with the same
    batch size and step limit reuses the rollout."""
    kwargs = {"batch_size": episodes + 1, "max_steps": 200, "hold_steps": 3} | overrides
    return collect(
        out,
        CollectConfig(episodes=episodes, image_size=image_size, seed=seed, **kwargs),
        progress=False,
    )


__all__ = [
    "ACTION_NAMES",
    "COLOURS",
    "FAST_COMPILE",
    "STATE_FIELDS",
    "REGIONS",
    "TARGETS",
    "CollectConfig",
    "collect",
    "collect_arm_config",
    "collect_config_from_info",
    "episode_length",
    "goal_region",
    "instruction",
    "make_collect_env",
    "make_rollout",
    "make_test_dataset",
    "state_index",
    "rollout_episodes",
]
