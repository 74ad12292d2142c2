"""Residual RL on a frozen VLA: the compact VLA (`vla.modeling_hoverfly_vla`) as the base policy of
`algos.residual.ResidualWrapper`, a state-based residual trained with PPO or SAC on object-centric
inputs (object-pose noise and dropout), in the run folder of `algos.run_folder`.

Residual policy learning on a frozen imitation policy: Ankile et al., "From Imitation to
Refinement -- Residual RL for Precise Assembly" (2024); Silver et al., "Residual Policy Learning"
(2018); the object-centric recipe (the residual sees object poses with noise and dropout, the base
sees images) as in `benchmarks/residual_manipulator.py`.

The base acts as the closed-loop evaluator of `vla.sft` does: every K = `n_action_steps` steps it
renders the front and wrist cameras (cube in the episode's colour, the instruction from colour and
goal region), reads the proprio state from the observation (`vla.collect.state_index`), samples a
chunk, un-normalizes it, clips it to [-1, 1] and plays its first K actions. Inside the jitted,
vmapped env step this is one `jax.pure_callback` per step (`vmap_method="broadcast_all"`: the host
gets the whole batch); its carry holds the chunk [K, A], the step within it and the cube colour,
and only the envs whose chunk is exhausted are rendered and re-planned (identical scenes once).
The flow noise is fixed (one [H, A] draw from `noise_seed`), so the base is a deterministic
function of (images, proprio, instruction): the residual learns against a reproducible base.

`import vla.residual` registers the bases "vla" and "vla_view" (`algos.residual.register_base`), so
a run folder with `residual.base = "vla"` (`residual.base_run` = the VLA checkpoint) loads with
`algos.run_folder.load_run` once this module is imported (algos/ cannot import vla/).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import threading
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from algos.evaluate import eval_steps, rollout, summarize
from algos.presets import ARM_PRESETS, EvalConfig, TrainConfig
from algos.residual import VLA_BASES, BasePolicy, ObsAugmentation, ResidualConfig, register_base
from algos.run_folder import atomic_write, load_run, make_run_policy, make_train_env
from sim import Env, State, manipulator
from vla.checkpoint import load_checkpoint, load_train_state, resolve_checkpoint
from vla.configuration_residual import POSE_FIELDS, VLAResidualConfig

__all__ = [
    "POSE_FIELDS",
    "StudentDriver",
    "VLABaseCarry",
    "VLAResidualConfig",
    "evaluate_vla_residual",
    "make_expert_rollout",
    "make_student_driver",
    "make_vla_base",
    "residual_train_config",
    "train_vla_residual",
]

EVAL_FILE = "eval_vla_residual.json"


class VLABaseCarry(NamedTuple):
    """The VLA base's per-env carry. chunk: [K, A] actions of the current chunk (clipped, env
    units). step: [] int32 index of the next action in it (K: re-plan). colour: [] int32 index of
    the cube colour into the checkpoint's collect colours (drawn at reset). features: [2, D] the
    pooled prefix (`PrefixCache.pooled`) of the episode's first plan and of its latest one (the
    view of `make_vla_base(view=True)`); fresh: [] bool, no plan yet in this episode."""

    chunk: jax.Array
    step: jax.Array
    colour: jax.Array
    features: jax.Array
    fresh: jax.Array


# -- host side -----------------------------------------------------------------------------------
class _Planner:
    """Host planner of a batch (numpy in, numpy out). Rendering and the model run on one worker
    thread that owns the GL context (created there on first use): XLA may call back from any of
    its threads, a GL context is current in one thread at a time."""

    def __init__(self, model, processor, env: Env, ccfg, noise: torch.Tensor):
        from vla.collect import COLOURS

        self.model, self.processor, self.env = model, processor, env
        self.ccfg, self.noise = ccfg, noise
        self.palette = [COLOURS[c] for c in ccfg.colours]
        self.center = env.unwrapped.config.init.cube_center
        self.k = model.config.n_action_steps
        self.plans = 0  # envs planned (rendered), for tests and logs
        self._renderer = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vla-base")
        self._lock = threading.Lock()

    def __call__(self, need, qpos, mocap, half, goal, proprio, colour):
        """(chunk [..., K, A], features [..., D]) for the rows where `need` [...] is set: a new
        chunk and the pooled prefix it was planned from (zeros in the other rows)."""
        with self._lock:
            return self._pool.submit(
                self._plan_batch, need, qpos, mocap, half, goal, proprio, colour
            ).result()

    def _plan_batch(self, need, qpos, mocap, half, goal, proprio, colour):
        lead = np.shape(need)
        n = int(np.prod(lead, dtype=np.int64))
        out = np.zeros((n, self.k, self.model.config.action_dim), np.float32)
        pooled = np.zeros((n, self.model.config.d_model), np.float32)
        rows = np.flatnonzero(np.asarray(need).reshape(n))
        if rows.size:
            flat = [np.asarray(a).reshape(n, -1)[rows] for a in (qpos, mocap, half, goal, proprio)]
            col = np.asarray(colour).reshape(n)[rows]
            # identical scenes (e.g. the padding of the auto-reset) are planned once
            key = np.concatenate([a.astype(np.float64) for a in flat] + [col[:, None]], axis=1)
            _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
            q, m, h, g, p = (a[first] for a in flat)
            planned, f = self.plan(q, m.reshape(len(first), -1, 3), h[:, 0], g, p, col[first])
            out[rows] = planned[inverse.reshape(-1)]
            pooled[rows] = f[inverse.reshape(-1)]
            self.plans += len(first)
        return out.reshape(*lead, *out.shape[1:]), pooled.reshape(*lead, -1)

    def plan(self, qpos, mocap, half, goal, proprio, colour) -> tuple[np.ndarray, np.ndarray]:
        """Actions [N, K, A] (clipped) of new chunks for N scenes and the pooled prefix [N, D]
        they were planned from: qpos [N, nq], mocap [N, nm, 3], half [N] (m), goal [N, 3] (m),
        proprio [N, Ds], colour [N] (index)."""
        from vla.collect import goal_region, instruction

        names = self.ccfg.colours
        texts = [
            instruction(names[c], goal_region(gl[:2], self.center))
            for c, gl in zip(colour, goal, strict=True)
        ]
        images = self._render(qpos, mocap, half, colour)
        c, w = self.model.config, self.ccfg.image_size[1]
        obs = {cam: images[..., i * w : (i + 1) * w, :] for i, cam in enumerate(c.cameras)}
        state = torch.from_numpy(np.asarray(proprio, np.float32))
        device = self.model.patch_pos.device
        with torch.inference_mode():
            batch = {k: v.to(device) for k, v in self.processor(obs, state, texts).items()}
            noise = self.noise.to(device).expand(len(state), *self.noise.shape).contiguous()
            cache = self.model.embed_prefix(batch)
            chunk = self.model.sample_actions(batch, noise=noise, cache=cache).cpu()
            actions = self.processor.actions_from_model(chunk, state)[:, : self.k]
        pooled = cache.pooled.float().cpu().numpy()
        return actions.clamp(-1.0, 1.0).numpy().astype(np.float32), pooled

    def _render(self, qpos, mocap, half, colour) -> np.ndarray:
        """[N, H, W · cams, 3] uint8, each cube in its colour (as `vla.sft._render`)."""
        if self._renderer is None:
            h, w = self.ccfg.image_size
            cams, camera = self.model.config.cameras, self.ccfg.wrist_camera
            self._renderer = manipulator.CameraRenderer(self.env, cams, h, w, camera)
            if not self.ccfg.shadows:
                self._renderer.model.light_castshadow[:] = 0
        r = self._renderer
        geom = self.env.unwrapped.index.cube_geom
        out = np.empty((len(qpos), r.height, r.width * len(r.cameras), 3), np.uint8)
        for c in np.unique(colour):
            idx = np.flatnonzero(colour == c)
            r.model.geom_rgba[geom] = self.palette[int(c)]
            out[idx] = r.render(qpos[idx], mocap[idx], half[idx])
        return out


# -- the base ------------------------------------------------------------------------------------
def _env_info(checkpoint_dir: Path) -> dict[str, Any]:
    state = load_train_state(checkpoint_dir) or {}
    if "env_info" not in state or not state["env_info"]:
        raise ValueError(
            f"{checkpoint_dir}: no env info in train_state.pt (an SFT checkpoint has it); pass "
            "env_info (a dataset's meta/info.json 'hoverfly' section)"
        )
    return json.loads(state["env_info"])


def _check_env(env: Env, model_config, state_idx: np.ndarray) -> None:
    arm = env.unwrapped
    if not isinstance(arm, manipulator.ArmEnv):
        raise ValueError(f"a VLA base drives the arm, not {type(arm).__name__}")
    if arm.config.action_space != "cartesian" or arm.config.task != "pick_place":
        raise ValueError("the VLA base needs arm pick-place with cartesian actions")
    if env.action_size != model_config.action_dim or len(state_idx) != model_config.proprio_dim:
        raise ValueError(
            f"the VLA takes {model_config.proprio_dim} states and gives {model_config.action_dim} "
            f"actions; the env gives {len(state_idx)} and takes {env.action_size}"
        )


def make_vla_base(
    checkpoint_dir: str | os.PathLike,
    env: Env,
    *,
    env_info: dict[str, Any] | None = None,
    noise_seed: int = 0,
    device: str | None = None,
    view: bool = False,
) -> BasePolicy:
    """The frozen VLA of `checkpoint_dir` as a residual base for the unbatched arm env `env`
    (pick-place, Cartesian actions: the env of `vla.collect.make_collect_env`, wrappers allowed).

    `env_info`: the dataset's "hoverfly" info (collect settings, state fields; default: the copy
    in the checkpoint's train_state.pt). `noise_seed`: the fixed flow noise [H, A] of every plan.
    `device`: torch device (default: cuda when available, else cpu). `view`: the residual sees
    what the VLA sees (`BasePolicy.observe`): its proprio state, the pooled prefix of the
    episode's first plan (the scene before the arm moves: the cube's start in view) and of its
    latest plan, instead of the env observation with its object poses.

    Returns a `BasePolicy` with `needs_state`: init(state) -> `VLABaseCarry` (colour drawn from
    the reset key), apply(obs [O], carry, state) -> (action [A] in [-1, 1], carry), pure JAX
    (a `jax.pure_callback`; jit and vmap it). Raises `ValueError` for an env it cannot drive."""
    from vla.collect import collect_config_from_info, state_index

    path = Path(checkpoint_dir)
    env_info = _env_info(path) if env_info is None else env_info
    ccfg = collect_config_from_info(env_info)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    manipulator.setup_gl()  # probes EGL in a child process: before XLA calls back
    model, processor = load_checkpoint(path, device)
    c = model.config
    state_idx = state_index(env_info["state_fields"], env.action_size)
    _check_env(env, c, state_idx)
    g = torch.Generator().manual_seed(noise_seed)
    noise = torch.randn((1, c.chunk_size, c.action_dim), generator=g)[0]
    planner = _Planner(model, processor, env, ccfg, noise)
    k, a, d, n_colours = c.n_action_steps, c.action_dim, c.d_model, len(ccfg.colours)
    idx = jnp.asarray(state_idx)

    def init(state: State) -> VLABaseCarry:
        key = jax.random.fold_in(state.info["rng"], 0x5EED)  # derived, not the env's own key
        colour = jax.random.randint(key, (), 0, n_colours, jnp.int32)
        k_steps = jnp.asarray(k, jnp.int32)
        return VLABaseCarry(jnp.zeros((k, a)), k_steps, colour, jnp.zeros((2, d)), jnp.array(True))

    def apply(obs: jax.Array, carry: VLABaseCarry, state: State):
        need = carry.step >= k
        px = state.data.physics
        planned, pooled = jax.pure_callback(
            planner,
            (jax.ShapeDtypeStruct((k, a), jnp.float32), jax.ShapeDtypeStruct((d,), jnp.float32)),
            need,
            px.qpos,
            px.mocap_pos,
            state.data.params.cube_half_size,
            state.data.goal,
            obs[idx],
            carry.colour,
            vmap_method="broadcast_all",
        )
        chunk = jnp.where(need, planned, carry.chunk)
        latest = jnp.where(need, pooled, carry.features[1])
        step = jnp.where(need, 0, carry.step)
        action = jax.lax.stop_gradient(chunk[step])
        features = jnp.stack([jnp.where(carry.fresh, latest, carry.features[0]), latest])
        return action, VLABaseCarry(chunk, step + 1, carry.colour, features, carry.fresh & ~need)

    def observe(obs: jax.Array, carry: VLABaseCarry) -> jax.Array:
        return jnp.concatenate([obs[idx], carry.features.reshape(-1)])

    apply.planner = planner  # the host side, for tests and logs (`plans`, `plan`)
    seen = {"observe": observe, "view_size": len(state_idx) + 2 * d} if view else {}
    return BasePolicy(init, apply, env.observation_size["state"][0], needs_state=True, **seen)


_BASES: dict[tuple, BasePolicy] = {}


def _registered_vla_base(source: str, env: Env, view: bool = False) -> BasePolicy:
    """Factory of the registered bases "vla" and "vla_view" (`view`): one base per checkpoint,
    arm config and view in a process (training, its final evaluation and `evaluate_vla_residual`
    share the model and renderer)."""
    arm_config = getattr(env.unwrapped, "config", None)
    key = (str(Path(source).resolve()), arm_config, env.observation_size["state"], view)
    if key not in _BASES:
        _BASES[key] = make_vla_base(source, env, view=view)
    return _BASES[key]


register_base("vla", _registered_vla_base)
register_base("vla_view", functools.partial(_registered_vla_base, view=True))


# -- training ------------------------------------------------------------------------------------
def residual_train_config(cfg: VLAResidualConfig) -> TrainConfig:
    """The `algos` TrainConfig of a VLA residual run (saved as the run's config.json)."""
    from vla.collect import collect_arm_config, collect_config_from_info

    ckpt = resolve_checkpoint(cfg.checkpoint).resolve()
    ccfg = collect_config_from_info(_env_info(ckpt))
    if not ccfg.randomize:
        raise ValueError(
            f"{ckpt}: its demonstrations were collected without domain randomization; a residual "
            "run trains under the arm's default randomization"
        )
    steps = cfg.episode_steps or ccfg.max_steps
    arm = dataclasses.replace(collect_arm_config(ccfg), episode_steps=steps)
    seconds = steps * arm.ctrl_dt
    vla_view = cfg.view == "vla"  # no object poses to corrupt
    residual = ResidualConfig(
        base="vla_view" if vla_view else "vla",
        base_run=str(ckpt),
        scale=cfg.scale,
        augmentation=ObsAugmentation() if vla_view else cfg.augmentation,
    )
    return dataclasses.replace(
        ARM_PRESETS["cpu"],
        task="arm-pick-place",
        seed=cfg.seed,
        arm=arm,
        arm_perturbation=cfg.perturbation,
        residual=residual,
        algo=cfg.algo,
        ppo=cfg.ppo,
        sac=cfg.sac,
        eval=EvalConfig(
            episodes=cfg.eval_episodes,
            seconds=seconds,
            settle_seconds=arm.ctrl_dt,
            seed=cfg.eval_seed,
        ),
        checkpoint_every=cfg.checkpoint_every,
    )


def train_vla_residual(
    cfg: VLAResidualConfig,
    *,
    stop_after: int | None = None,
    evaluate: bool = True,
    cache_dir: Any = "default",
    console: Any = None,
) -> dict[str, Any]:
    """Trains (or resumes) the residual run `cfg.out` with `algos.runner.train` (its eval.json:
    base + residual under the training augmentation), then, once complete and with `evaluate`,
    compares the base alone with base + residual (`evaluate_vla_residual`).

    `stop_after`: end this session after that many updates (resume by calling again).
    Returns {"run", "update", "total", "eval" (None until complete)}."""
    from algos import runner

    result = runner.train(
        residual_train_config(cfg),
        Path(cfg.out),
        cache_dir=cache_dir,
        stop_after=stop_after,
        console=console,
    )
    done = result.update >= result.total
    comparison = evaluate_vla_residual(cfg.out) if done and evaluate else None
    return {"run": str(cfg.out), "update": result.update, "total": result.total, "eval": comparison}


class StudentDriver(NamedTuple):
    """A VLA that drives an unbatched env until the expert takes over (`make_student_driver`).
    init(seed, state) -> (carry, first): its carry and the takeover step, drawn from the reset
    seed. act(obs, state, carry, first, t) -> (driving, action [A], carry): its action at step t
    while `driving` (t < first); afterwards it stops planning (its action is then stale)."""

    init: Any
    act: Any


def make_student_driver(
    checkpoint: str | os.PathLike, env: Env, takeover: tuple[int, int]
) -> StudentDriver:
    """The VLA of `checkpoint` (`make_vla_base`) driving the unbatched arm env `env` from each
    reset until a step drawn uniformly from `takeover` (first, last). ValueError when its
    demonstrations ran in other arm settings than `env`'s."""
    from vla.collect import collect_arm_config, collect_config_from_info

    path = resolve_checkpoint(checkpoint)
    arm = collect_arm_config(collect_config_from_info(_env_info(path)))
    if arm != env.unwrapped.config:
        raise ValueError(f"{checkpoint}: the student's demonstrations ran in other arm settings")
    base = make_vla_base(path, env)
    lo, hi = takeover

    def init(seed: jax.Array, state: State) -> tuple[VLABaseCarry, jax.Array]:
        key = jax.random.fold_in(jax.random.key(seed), 0x7A6E)
        return base.init(state), jax.random.randint(key, (), lo, hi + 1, jnp.int32)

    def act(obs, state: State, carry: VLABaseCarry, first: jax.Array, t: jax.Array):
        driving = t < first
        carry = carry._replace(step=jnp.where(driving, carry.step, 0))  # no plans after it
        action, carry = base.apply(obs, carry, state)
        return driving, action, carry

    return StudentDriver(init, act)


def make_expert_rollout(
    run_dir: str | os.PathLike,
    max_steps: int,
    student: str | os.PathLike | None = None,
    takeover: tuple[int, int] = (0, 0),
) -> tuple[Env, Any]:
    """(env, rollout) of a VLA residual run as a demonstration expert (`vla.collect`'s
    `CollectConfig.expert`): the frozen VLA plus the trained residual (deterministic), in the run's
    env without the training augmentation, as `evaluate_vla_residual` scores them.

    `student`: a VLA checkpoint that drives each episode until the expert takes over at a step
    drawn uniformly from `takeover` (first, last) per episode (from its reset seed); the
    expert's base then plans at once, from the student's state (DAgger-style data).

    rollout(reset_seeds [B] uint32) follows `vla.collect.make_rollout`: obs [T, B, O] (the arm's
    actor observation), qpos, mocap_pos before action t; action [T, B, A] (the command the arm
    got: the student's, then base + scaled correction, clipped); reward, success, done after it;
    cube_half_size [B], goal [B, 3]; takeover [B] (int32, the expert's first step). Pure; jit it
    at the edge. ValueError for a run whose base is not a VLA, or a student for another env."""
    run = load_run(Path(run_dir))
    cfg = run.config
    if cfg.residual.base not in VLA_BASES:
        raise ValueError(
            f"{run_dir}: config.json: residual.base is {cfg.residual.base!r}; an expert run is a "
            f"`hoverfly vla residual` run (base one of {VLA_BASES})"
        )
    env = _without_augmentation(run)
    policy = make_run_policy(cfg.algo, run.network, run.params, deterministic=True)
    key = jax.random.key(0)  # unused: the deterministic policy is the mean
    driver = None if student is None else make_student_driver(student, env.env, takeover)

    def start(seed: jax.Array) -> tuple[State, Any, jax.Array]:
        state = env.reset(jax.random.key(seed))
        if driver is None:
            return state, (), jnp.zeros((), jnp.int32)
        return state, *driver.init(seed, state)

    def advance(state: State, carry: Any, first: jax.Array, t: jax.Array, correction):
        command = env.applied_action(state, correction)
        if driver is not None:
            obs = state.info["inner_obs"]["state"]
            driving, action, carry = driver.act(obs, state, carry, first, t)
            command = jnp.where(driving, action, command)
            # the expert's base plans once it drives: at the takeover step, from that state
            base = state.info["base_state"]
            k = base.chunk.shape[0]  # step k: plan now
            plan = jnp.where(t + 1 == first, k, jnp.where(t + 1 < first, 0, base.step))
            state = state.replace(info={**state.info, "base_state": base._replace(step=plan)})
        return env.step_command(state, command), carry, command

    def expert_rollout(seeds: jax.Array) -> dict[str, jax.Array]:
        state, carry, first = jax.vmap(start)(seeds)

        def step(c, t):
            state, carry = c
            correction, _ = policy(state.obs["state"], key)
            nstate, carry, command = jax.vmap(advance, (0, 0, 0, None, 0))(
                state, carry, first, t, correction
            )
            px = state.data.physics
            out = {
                "obs": state.info["inner_obs"]["state"],
                "qpos": px.qpos,
                "mocap_pos": px.mocap_pos,
                "action": command,
                "reward": nstate.reward,
                "success": nstate.metrics["success"],
                "done": nstate.done,
            }
            return (nstate, carry), out

        _, traj = jax.lax.scan(step, (state, carry), jnp.arange(max_steps))
        data = state.data
        return traj | {
            "cube_half_size": data.params.cube_half_size,
            "goal": data.goal,
            "takeover": first,
        }

    return env, expert_rollout


def _without_augmentation(run) -> Env:
    """The run's env with the residual's observation augmentation off (perturbations kept)."""
    clean = dataclasses.replace(run.config.residual, augmentation=ObsAugmentation())
    return make_train_env(dataclasses.replace(run.config, residual=clean))


def evaluate_vla_residual(
    run_dir: str | os.PathLike,
    *,
    episodes: int | None = None,
    seed: int | None = None,
    augment: bool = False,
) -> dict[str, Any]:
    """Success of the base alone (zero correction) and of base + residual (deterministic) over
    the same episodes (same reset keys; the base is deterministic), in the run's env without the
    training augmentation (`augment=False`; perturbations as configured).

    Protocol of `algos.evaluate.summarize`: success = the cube at the goal at the episode's last
    step without termination; "reached" = at the goal at any step. Writes RUN/eval_vla_residual.json
    (for the protocol's episodes and seed). Returns {"base": {...}, "residual": {...},
    "gain_points": residual − base success, in percentage points, "update"}."""
    run = load_run(Path(run_dir))
    cfg = run.config
    env = run.env if augment else _without_augmentation(run)
    n = cfg.eval.episodes if episodes is None else episodes
    key = jax.random.key(cfg.eval.seed if seed is None else seed)
    steps, settle = eval_steps(cfg.eval, env.dt)
    policy = make_run_policy(cfg.algo, run.network, run.params, deterministic=True)

    def episodes_with(key: jax.Array, gain: jax.Array) -> dict[str, jax.Array]:
        # gain 0: zero correction (the base alone); 1: base + residual. One compile for both.
        def scaled(obs, k):
            return gain * policy(obs, k)[0], {}

        return rollout(env, scaled, key, n, steps)

    run_fn = jax.jit(episodes_with, compiler_options=env.compiler_options)
    out: dict[str, Any] = {}
    for name, gain in (("base", 0.0), ("residual", 1.0)):
        traj = jax.device_get(run_fn(key, jnp.float32(gain)))
        summary = summarize(traj, settle, cfg.eval.tolerance)
        reached = np.asarray(traj["success"]).max(0) > 0
        out[name] = summary | {"reached_rate": float(np.mean(reached))}
    out["gain_points"] = 100.0 * (out["residual"]["success_rate"] - out["base"]["success_rate"])
    out["update"] = run.update
    if episodes is None and seed is None and not augment:
        atomic_write(Path(run_dir) / EVAL_FILE, json.dumps(out, indent=2) + "\n")
    return out
