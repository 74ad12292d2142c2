"""Supervised fine-tuning (behaviour cloning) of the compact VLA on a LeRobotDataset with the
flow-matching loss (π0: Black et al. 2024), and closed-loop evaluation in the MJX arm simulator.

Run folder written by `train_sft(cfg)`::

    <out>/sft_config.json               SFTConfig, resolved model config, dataset fingerprint
    <out>/metrics.csv                   step, loss, lr, grad_norm, samples_per_s, elapsed_s
    <out>/eval.csv                      step, success_rate, ... (when eval_every > 0)
    <out>/checkpoints/step_<NNNNNNNN>/  vla.checkpoint folders (config, weights, processor with
                                        its norm stats, train_state.pt: optimizer, scheduler,
                                        step, torch / numpy RNG states, dataset info; with
                                        `ema_decay` the folder's model is the moving average
                                        and train_state.pt holds the trained weights)

A rerun with the same `out` resumes from the newest checkpoint (bitwise the same losses as an
uninterrupted run on CPU); fields that change the training (everything but `_RESUMABLE`) must
match, else `ValueError` names them. `steps` may be raised to extend a finished run (the cosine
schedule is then over the new `steps`).

Actions: the arm datasets of `vla.collect` hold Cartesian tool DELTAS (x, y, z) plus an ABSOLUTE
gripper command, so the model is trained on them as they are (`action_representation="absolute"`:
the stored action, normalized); "delta" (action − state[:A]) only makes sense when the action
components are the same quantities as the first state entries, and is refused for these datasets.
The norm statistics are computed over exactly the training targets (the action chunks [N, H, A]
in the chosen representation) and saved in every checkpoint's processor.json.
"""

from __future__ import annotations

import copy
import csv
import functools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.run_folder import atomic_write
from vla.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_train_state,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from vla.configuration_hoverfly_vla import PRESETS, HoverflyVLAConfig
from vla.configuration_sft import SFTConfig
from vla.dataset import DatasetError, LeRobotDataset
from vla.frames import (
    Frames,
    camera_key,
    check_poolable,
    fingerprint,
    gather_batch,
    load_frames,
)
from vla.modeling_hoverfly_vla import HoverflyVLA
from vla.processor_hoverfly_vla import HoverflyVLAProcessor, compute_norm_stats

__all__ = ["evaluate_closed_loop", "latest_checkpoint", "train_sft"]

_RESUMABLE = (
    "out",
    "steps",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "eval_every",
    "eval_episodes",
    "device",
)
"""SFTConfig fields a resumed run may change (they do not alter the optimization path; `out`:
a run folder copied or moved elsewhere resumes there)."""
_METRICS = ("step", "loss", "lr", "grad_norm", "samples_per_s", "elapsed_s")
_CARTESIAN_ACTIONS = ("tcp_dx", "tcp_dy", "tcp_dz", "gripper")


# -- data ------------------------------------------------------------------------------------------
def _model_config(
    cfg: SFTConfig, ds: LeRobotDataset, initial: HoverflyVLAConfig | None = None
) -> HoverflyVLAConfig:
    """The preset with the overrides, sized to the dataset's state and action (or the `initial`
    model's config, as it is); DatasetError when the dataset lacks what the model reads."""
    info_path = ds.root / "meta" / "info.json"
    for key in ("observation.state", "action"):
        if key not in ds.features or len(ds.features[key]["shape"]) != 1:
            raise DatasetError(f"{info_path}: features.{key}: missing or not a vector")
    sizes = {
        "proprio_dim": ds.features["observation.state"]["shape"][0],
        "action_dim": ds.features["action"]["shape"][0],
    }
    mcfg = initial or PRESETS[cfg.preset].replace(**(sizes | dict(cfg.model_overrides)))
    missing = [c for c in mcfg.cameras if camera_key(c) not in ds.camera_keys]
    if missing:
        raise DatasetError(
            f"{info_path}: features: no camera(s) {missing} (the model reads {list(mcfg.cameras)}; "
            f"the dataset has {ds.camera_keys})"
        )
    for key, dim in (("observation.state", mcfg.proprio_dim), ("action", mcfg.action_dim)):
        if ds.features[key]["shape"][0] != dim:
            raise DatasetError(
                f"{info_path}: features.{key}.shape: {ds.features[key]['shape']}, the model "
                f"config needs [{dim}]"
            )
    if cfg.action_representation == "delta":
        names = tuple(ds.features["action"].get("names") or ())
        if names == _CARTESIAN_ACTIONS:
            raise ValueError(
                "SFTConfig.action_representation: 'delta' subtracts state[:A] from the action, but "
                f"this dataset's actions {names} are already relative Cartesian commands plus an "
                "absolute gripper, not the quantities of state[:A]; use 'absolute'"
            )
    return mcfg


def _initial_model(
    cfg: SFTConfig, path: Path | None, device: torch.device
) -> tuple[HoverflyVLA, HoverflyVLAProcessor] | tuple[None, None]:
    """The model and processor of the checkpoint `path` (its normalization checked against
    `cfg`), or (None, None) without one."""
    if path is None:
        return None, None
    model, processor = load_checkpoint(path, device)
    stats = processor.stats
    theirs = (stats.mode, stats.action_representation)
    if theirs != (cfg.norm_mode, cfg.action_representation):
        raise ValueError(
            f"SFTConfig.init: {path} normalizes with {theirs}, the config asks for "
            f"{(cfg.norm_mode, cfg.action_representation)}"
        )
    return model, processor


# -- optimization ----------------------------------------------------------------------------------
def _lr_factor(cfg: SFTConfig) -> Callable[[int], float]:
    """lr(step) / lr: linear warm-up to 1 over `warmup_steps`, then cosine to `min_lr_ratio`."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        span = max(cfg.steps - cfg.warmup_steps, 1)
        progress = min((step - cfg.warmup_steps) / span, 1.0)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _optimizer(cfg: SFTConfig, model: HoverflyVLA) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


# -- run folder ------------------------------------------------------------------------------------
def _refuse_changed_config(
    path: Path,
    section: str,
    record: dict[str, Any],
    resumable: tuple[str, ...],
    defaults: dict[str, Any],
) -> dict[str, Any] | None:
    """The run record saved at `path` (None when there is none yet); ValueError naming every field
    of `record[section]` that differs from the saved one, apart from the `resumable` fields. A
    field the saved record lacks (added since) counts as its value in `defaults`."""
    if not path.is_file():
        return None
    old = json.loads(path.read_text())
    old_cfg, new_cfg = defaults | old.get(section, {}), record[section]
    changed = sorted(
        k
        for k in set(old_cfg) | set(new_cfg)
        if k not in resumable and old_cfg.get(k) != new_cfg.get(k)
    )
    if changed:
        diffs = ", ".join(f"{k}: {old_cfg.get(k)!r} -> {new_cfg.get(k)!r}" for k in changed)
        raise ValueError(
            f"{path.parent} holds a run with a different config ({diffs}); use another `out` or "
            "delete it"
        )
    return old


def _check_same_run(out: Path, record: dict[str, Any]) -> None:
    """ValueError when `out` holds a run of a different config, DatasetError when its dataset
    changed; fields in `_RESUMABLE` may differ."""
    old = _refuse_changed_config(
        out / "sft_config.json", "sft", record, _RESUMABLE, SFTConfig().to_dict()
    )
    if old is not None and old.get("dataset") != record["dataset"]:
        raise DatasetError(
            f"{', '.join(record['sft']['data'])}: dataset: differs from the one the run in {out} "
            "was trained on (episodes / frames / features)"
        )


def _truncate_csv(path: Path, step: int) -> None:
    """Drops rows logged after `step` (by a run killed after its last checkpoint)."""
    if not path.is_file():
        return
    with path.open() as f:
        rows = list(csv.reader(f))
    if rows:
        kept = [rows[0]] + [r for r in rows[1:] if r and int(r[0]) <= step]
        with path.open("w", newline="") as f:
            csv.writer(f).writerows(kept)


def _append_csv(path: Path, header: tuple[str, ...], row: dict[str, Any]) -> None:
    new = not path.is_file()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        if new:
            w.writeheader()
        w.writerow({k: row[k] for k in header})


# -- training --------------------------------------------------------------------------------------
@dataclass
class _Run:
    """The mutable training objects of one run folder (this I/O shell's state)."""

    cfg: SFTConfig
    out: Path
    record: dict[str, Any]
    env_info: dict[str, Any] | None
    frames: Frames
    processor: HoverflyVLAProcessor
    model: HoverflyVLA
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    batch_rng: np.random.Generator
    noise_gen: torch.Generator
    ema: HoverflyVLA | None = None
    """The weights' moving average (`SFTConfig.ema_decay` > 0), or None."""
    step: int = 0

    @classmethod
    def create(cls, cfg: SFTConfig) -> _Run:
        """Reads the dataset, builds processor (norm stats), model and optimizer from `cfg`."""
        out = Path(cfg.out)
        datasets = [LeRobotDataset(d) for d in cfg.data]
        check_poolable(datasets)
        device = torch.device(cfg.device)
        init = resolve_checkpoint(cfg.init).resolve() if cfg.init else None
        model, processor = _initial_model(cfg, init, device)
        mcfg = _model_config(cfg, datasets[0], model and model.config)
        record = {
            "sft": cfg.to_dict()
            | {
                "data": [str(Path(d).resolve()) for d in cfg.data],
                "init": str(init) if init else "",
            },
            "model": mcfg.to_dict(),
            "dataset": [fingerprint(ds) for ds in datasets],
        }
        _check_same_run(out, record)
        frames = load_frames(datasets, mcfg, device)
        ss = np.random.SeedSequence(cfg.seed).spawn(3)  # init, batch order, flow noise
        if model is None:
            stats = compute_norm_stats(
                frames.states, frames.chunks, cfg.norm_mode, cfg.action_representation
            )
            init_gen = torch.Generator().manual_seed(int(ss[0].generate_state(1)[0]))
            model = HoverflyVLA(mcfg, generator=init_gen).to(device)
            processor = HoverflyVLAProcessor(mcfg, stats)
        model.train()
        ema = make_ema(model, cfg.ema_decay)
        optimizer = _optimizer(cfg, model)
        return cls(
            cfg,
            out,
            record,
            datasets[0].info.get("hoverfly"),
            frames,
            processor,
            model,
            optimizer,
            torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(cfg)),
            np.random.default_rng(ss[1]),
            torch.Generator(device).manual_seed(int(ss[2].generate_state(1)[0])),
            ema,
        )

    @property
    def policy(self) -> HoverflyVLA:
        """What is evaluated and checkpointed: the moving average if there is one."""
        return self.model if self.ema is None else self.ema

    def save(self) -> Path:
        """Checkpoint of the current step (atomic), older ones pruned."""
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "noise_rng": self.noise_gen.get_state(),
            "numpy_rng": json.dumps(self.batch_rng.bit_generator.state),
            "sft_config": json.dumps(self.record),
            "env_info": json.dumps(self.env_info),
        } | trained_weights(self.ema, self.model)
        path = self.out / "checkpoints" / f"step_{self.step:08d}"
        save_checkpoint(path, self.policy, self.processor, state)
        prune_checkpoints(self.out, self.cfg.keep_checkpoints)
        return path

    def resume(self, path: Path) -> None:
        """Loads the checkpoint at `path` into the training objects."""
        state = load_train_state(path)
        if state is None:
            raise ValueError(f"{path}: no train_state.pt to resume from")
        loaded, loaded_processor = load_checkpoint(path, self.model.patch_pos.device)
        if loaded_processor.to_dict() != self.processor.to_dict():
            raise DatasetError(
                f"{path}: processor.json: norm stats / tokenizer differ from the ones the dataset "
                f"{', '.join(self.cfg.data)} give now"
            )
        restore_weights(self.model, self.ema, loaded, state, path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        factor = _lr_factor(self.cfg)  # over the current `steps`, which may have grown
        self.scheduler.lr_lambdas = [factor] * len(self.optimizer.param_groups)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr * factor(self.step)
        torch.set_rng_state(state["torch_rng"])
        self.noise_gen.set_state(state["noise_rng"])
        self.batch_rng.bit_generator.state = json.loads(state["numpy_rng"])

    def train_step(self) -> dict[str, float]:
        """One AdamW step on a random batch; returns loss, lr (used), grad_norm (pre-clip)."""
        cfg = self.cfg
        idx = self.batch_rng.integers(0, len(self.frames.states), cfg.batch_size)
        batch = gather_batch(self.frames, self.processor, idx, self.model.patch_pos.device)
        loss = self.model.flow_matching_loss(batch, generator=self.noise_gen)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        update_ema(self.ema, self.model, cfg.ema_decay)
        self.scheduler.step()
        self.step += 1
        return {"loss": float(loss.detach()), "lr": lr, "grad_norm": float(grad_norm)}

    def evaluate(self) -> None:
        """Closed-loop evaluation of the current policy, appended to eval.csv."""
        self.model.eval()
        result = _evaluate(
            self.policy, self.processor, self.env_info, self.cfg.eval_episodes, self.cfg.seed
        )
        self.model.train()
        row = {"step": self.step} | {k: result[k] for k in _EVAL_COLUMNS}
        _append_csv(self.out / "eval.csv", ("step", *_EVAL_COLUMNS), row)


# -- moving average of the weights (SFT and RL) ---------------------------------------------------
def make_ema(model: HoverflyVLA, decay: float) -> HoverflyVLA | None:
    """A frozen copy of `model` to average into (`decay` > 0), else None."""
    return copy.deepcopy(model).eval().requires_grad_(False) if decay > 0 else None


def trained_weights(ema: HoverflyVLA | None, model: HoverflyVLA) -> dict[str, Any]:
    """The train_state.pt entry of a run whose checkpoints hold the average: the trained weights."""
    return {} if ema is None else {"trained": model.state_dict()}


def restore_weights(
    model: HoverflyVLA, ema: HoverflyVLA | None, loaded: HoverflyVLA, state: dict, path: Path
) -> None:
    """Loads a checkpoint saved with `trained_weights`: its model into the average (or into
    `model` without one), the trained weights of train_state.pt into `model`."""
    if ema is None:
        model.load_state_dict(loaded.state_dict())
        return
    if "trained" not in state:
        raise ValueError(f"{path}: train_state.pt holds no trained weights for the EMA run")
    ema.load_state_dict(loaded.state_dict())
    model.load_state_dict(state["trained"])


def update_ema(avg: HoverflyVLA | None, model: HoverflyVLA, decay: float) -> None:
    """p̄ ← decay · p̄ + (1 − decay) · p for every parameter of `avg` (nothing when None)."""
    if avg is None:
        return
    with torch.no_grad():
        for a, p in zip(avg.parameters(), model.parameters(), strict=True):
            a.lerp_(p, 1.0 - decay)


def train_sft(
    cfg: SFTConfig,
    progress: bool = True,
    callback: Callable[[int, dict[str, float]], None] | None = None,
) -> Path:
    """Trains (or resumes) the run `cfg.out` to `cfg.steps`; returns its final checkpoint folder.

    `callback(step, metrics)` is called after every optimizer step (an exception raised there
    stops training like a kill would: the run resumes from its last checkpoint)."""
    cfg.validate()
    run = _Run.create(cfg)
    last = latest_checkpoint(run.out)
    if last is not None:
        run.resume(last)
    run.out.mkdir(parents=True, exist_ok=True)
    atomic_write(run.out / "sft_config.json", json.dumps(run.record, indent=2) + "\n")
    _truncate_csv(run.out / "metrics.csv", run.step)
    _truncate_csv(run.out / "eval.csv", run.step)
    final = last if last is not None and run.step >= cfg.steps else None
    with _progress(progress) as bar:
        task = bar.add_task("sft", total=cfg.steps, completed=run.step)
        t0 = t_log = time.perf_counter()
        n_log = 0
        while run.step < cfg.steps:
            metrics = run.train_step()
            step, n_log = run.step, n_log + cfg.batch_size
            if step % cfg.log_every == 0 or step == cfg.steps:
                now = time.perf_counter()
                rate = n_log / max(now - t_log, 1e-9)
                row = metrics | {"step": step, "samples_per_s": rate, "elapsed_s": now - t0}
                _append_csv(run.out / "metrics.csv", _METRICS, row)
                t_log, n_log = now, 0
            bar.update(task, completed=step, description=f"sft loss {metrics['loss']:.4f}")
            if callback is not None:
                callback(step, metrics)
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                final = run.save()
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                run.evaluate()
    return final if final is not None else run.save()


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        "{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=Console(stderr=True), disable=not enabled)


# -- closed-loop evaluation ------------------------------------------------------------------------
_EVAL_COLUMNS = ("success_rate", "mean_return", "mean_length", "episodes")


def final_evaluation(cfg: SFTConfig, checkpoint_dir: Path) -> dict[str, Any]:
    """The closed-loop evaluation of the run's final checkpoint: eval.csv's row of its step when
    training evaluated it (`eval_every` > 0), else `cfg.eval_episodes` episodes evaluated now with
    the training's seed (the episodes training would have evaluated)."""
    step = load_train_state(checkpoint_dir)["step"]
    path = Path(cfg.out) / "eval.csv"
    if path.exists():
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) == step]
        if rows:
            result = {k: float(rows[-1][k]) for k in _EVAL_COLUMNS}
            return result | {"episodes": int(result["episodes"]), "step": step}
    result = evaluate_closed_loop(checkpoint_dir, cfg.eval_episodes, cfg.seed, device=cfg.device)
    return {k: result[k] for k in _EVAL_COLUMNS} | {"step": step}


def evaluate_closed_loop(
    checkpoint_dir: str | os.PathLike,
    episodes: int = 16,
    seed: int = 0,
    dataset: str | os.PathLike | None = None,
    max_steps: int | None = None,
    device: str = "cpu",
    compiler_options: dict[str, Any] | None = None,
    reset_seeds: np.ndarray | list[int] | None = None,
    noise_scale: float = 1.0,
    action_steps: int | None = None,
    branches: int = 1,
) -> dict[str, Any]:
    """Success of the checkpoint's policy in the arm env its dataset was collected in.

    The env settings come from the dataset's meta/info.json "hoverfly" section (a copy is kept in
    the checkpoint's train_state; `dataset` overrides it). `episodes` episodes run batched; each
    re-plans every `n_action_steps` (see `_evaluate`). `max_steps` shortens the episodes (default:
    the dataset's `max_steps`). `reset_seeds` [N] replays given episodes instead (each reset is
    `env.reset(jax.random.key(reset_seed))` as in `vla.collect`, the cube colour cycled as there:
    the `reset_seed`s of a dataset's first N episodes give those episodes' scenes; `episodes` is
    then N). `noise_scale`, `action_steps` and `branches`: see `_evaluate`. Returns success_rate,
    mean_return, mean_length, episodes, success [episodes] (bool), first_success [episodes] (step
    index, -1 if never), end_cube_lifted, end_cube_goal_m, reached_cube [episodes], instructions
    [episodes], goals [episodes][3] (world, m), seconds."""
    model, processor = load_checkpoint(checkpoint_dir, device)
    if dataset is not None:
        env_info = LeRobotDataset(dataset).info.get("hoverfly")
    else:
        state = load_train_state(checkpoint_dir) or {}
        if "env_info" not in state:
            raise ValueError(f"{checkpoint_dir}: no env info in train_state.pt; pass `dataset`")
        env_info = json.loads(state["env_info"])
    return _evaluate(
        model, processor, env_info, episodes, seed, max_steps, compiler_options, reset_seeds,
        noise_scale, action_steps, branches,
    )  # fmt: skip


@functools.cache
def _compiled_env(config, k: int, options: tuple) -> tuple[Any, Any, Any]:
    """(env, jit(vmap(reset)), jit(execute)) for a collect config; execute(state, dead, actions
    [K, B, A]) -> (state, dead, (success, done, reward) each [K, B]) steps K times (episodes
    that terminated stay frozen)."""
    import jax
    import jax.numpy as jnp

    from vla.collect import make_collect_env

    env = make_collect_env(config)
    opts = env.compiler_options | dict(options)

    def execute(state, dead, actions):
        def body(carry, action):
            s, dead = carry
            ns = jax.vmap(env.step)(s, action)
            keep = dead > 0

            def freeze(old, new):
                return jnp.where(jnp.reshape(keep, (-1,) + (1,) * (old.ndim - 1)), old, new)

            ns = jax.tree.map(freeze, s, ns)
            out = (ns.metrics["success"], jnp.maximum(dead, ns.done), ns.reward)
            return (ns, out[1]), out

        (state, dead), out = jax.lax.scan(body, (state, dead), actions)
        return state, dead, out

    reset = jax.jit(jax.vmap(env.reset), compiler_options=opts)
    return env, reset, jax.jit(execute, compiler_options=opts)


def _evaluate(
    model: HoverflyVLA,
    processor: HoverflyVLAProcessor,
    env_info: dict[str, Any] | None,
    episodes: int,
    seed: int,
    max_steps: int | None = None,
    compiler_options: dict[str, Any] | None = None,
    reset_seeds: np.ndarray | list[int] | None = None,
    noise_scale: float = 1.0,
    action_steps: int | None = None,
    branches: int = 1,
) -> dict[str, Any]:
    """Runs `episodes` episodes of the policy batched: at each chunk boundary the cameras are
    rendered for every env (cube in the episode's colour), the state vector is read from the actor
    observation (`state_fields`), an action chunk is sampled (Euler flow from noise drawn from
    `seed`, times `noise_scale`: 0 integrates from zero noise), un-normalized, clipped to [-1, 1],
    and its first K actions are executed (K = `action_steps`, default the model's
    `n_action_steps`).

    `branches` N > 1 is a search with the simulator as the critic, not a policy: each env samples
    N chunks (other noise), runs each from a copy of its state, and keeps the one that
    `best_branches` ranks first (success in the chunk, then the env's shaped reward summed over
    it). It bounds what choosing the flow noise chunk by chunk (a steering policy over the noise,
    value-guided sampling) could reach with a perfect one-chunk critic.

    Success follows `vla.collect`: the episode's recorded length is `episode_length` (up to
    `hold_steps` steps after its first success, or its first termination, or `max_steps`) and
    success is the env's `success` metric at that last step, i.e. the cube reached the goal and
    is still there `hold_steps` steps later (or at the time limit). Where the episodes end (after
    the last executed chunk): `end_cube_lifted` [episodes] (the cube ≥ 1 cm above its resting
    height), `end_cube_goal_m` [episodes] and `reached_cube` [episodes] (the tool came within
    the env's reach radius of the cube at some step); where they began: `cube_start`
    [episodes, 3] (m)."""
    import jax
    import jax.numpy as jnp

    from sim.manipulator import CameraRenderer, setup_gl
    from vla.collect import collect_config_from_info, goal_region, instruction, state_index

    setup_gl()
    start = time.perf_counter()
    ccfg = collect_config_from_info(env_info)
    c = model.config
    t_max = ccfg.max_steps if max_steps is None else int(max_steps)
    k = c.n_action_steps if action_steps is None else int(action_steps)
    if not 1 <= k <= c.chunk_size:
        raise ValueError(f"action_steps: {k} not in [1, chunk_size = {c.chunk_size}]")
    if branches < 1:
        raise ValueError(f"branches: {branches} < 1")
    env, reset, execute = _compiled_env(ccfg, k, tuple(sorted((compiler_options or {}).items())))
    arm = env.unwrapped
    state_idx = jnp.asarray(state_index(env_info["state_fields"], env.action_size))
    key_env, key_policy = jax.random.split(jax.random.key(seed))
    if reset_seeds is None:
        state = reset(jax.random.split(key_env, episodes))
    else:
        seeds = np.asarray(reset_seeds, np.uint32).reshape(-1)
        episodes = len(seeds)
        state = reset(jax.vmap(jax.random.key)(jnp.asarray(seeds)))
    dead = jnp.zeros(episodes)
    cube_xyz = slice(arm.index.cube_qpos, arm.index.cube_qpos + 3)  # of qpos
    cube_start = np.asarray(state.data.physics.qpos)[:, cube_xyz]
    noise_gen = torch.Generator(model.patch_pos.device).manual_seed(
        int(jax.random.randint(key_policy, (), 0, 2**31 - 1))
    )
    colours = [ccfg.colours[i % len(ccfg.colours)] for i in range(episodes)]
    goals = np.asarray(jax.device_get(state.data.goal))
    texts = [
        instruction(col, goal_region(g[:2], arm.config.init.cube_center))
        for col, g in zip(colours, goals, strict=True)
    ]
    (h, w), cams = ccfg.image_size, c.cameras
    look = (colours, arm.index.cube_geom)
    success, done, reward = [], [], []
    with CameraRenderer(env, cams, h, w, ccfg.wrist_camera) as renderer:
        if not ccfg.shadows:
            renderer.model.light_castshadow[:] = 0
        t = 0
        while t < t_max:
            actions = _plan(
                model, processor, renderer, state, state_idx, texts, look, noise_gen, k,
                noise_scale, branches,
            )  # fmt: skip
            if branches == 1:
                state, dead, (s, d, r) = execute(state, dead, actions)
            else:
                copies = jax.tree.map(lambda x: jnp.repeat(x, branches, axis=0), (state, dead))
                state, dead, steps = execute(*copies, actions)
                s, d, r = (np.asarray(v) for v in steps)
                pick = best_branches(s, r, branches)
                state, dead = jax.tree.map(lambda x, i=pick: x[i], (state, dead))
                s, d, r = s[:, pick], d[:, pick], r[:, pick]
            success.append(np.asarray(s))
            done.append(np.asarray(d))
            reward.append(np.asarray(r))
            t += k
            if _all_finished(np.concatenate(success), np.concatenate(done), ccfg.hold_steps):
                break
    out = _summarize(success, done, reward, ccfg.hold_steps, t_max)
    seconds = time.perf_counter() - start
    data = jax.device_get(state.data)
    cube = np.asarray(data.physics.qpos)[:, cube_xyz]
    end = {
        "end_cube_lifted": (cube[:, 2] - np.asarray(data.params.cube_half_size) >= 0.01).tolist(),
        "end_cube_goal_m": np.linalg.norm(cube - np.asarray(data.goal), axis=1).tolist(),
        "reached_cube": (np.asarray(data.reached) > 0).tolist(),
        "cube_start": cube_start.tolist(),
    }
    return out | end | {"instructions": texts, "goals": goals.tolist(), "seconds": seconds}


def _plan(
    model,
    processor,
    renderer,
    state,
    state_idx,
    texts,
    look,
    noise_gen,
    k=None,
    noise_scale=1.0,
    branches=1,
):
    """The first `k` actions [k, B · branches, A] (jax; default k: the model's
    `n_action_steps`) of new chunks for the batched env `state`, `branches` per env (env-major):
    renders the cameras (look = (cube colour per episode, cube geom id)), reads the proprio state
    (JAX → torch through DLPack), samples chunks from noise × `noise_scale` and un-normalizes
    them."""
    import jax.numpy as jnp

    from vla.collect import COLOURS

    c, w = model.config, renderer.width
    images = _render(renderer, state, *look, COLOURS)
    obs = {cam: images[..., i * w : (i + 1) * w, :] for i, cam in enumerate(c.cameras)}
    proprio = torch.from_dlpack(jnp.take(state.obs["state"], state_idx, axis=1))
    proprio = proprio.to("cpu", torch.float32)  # the processor runs on the host
    batch = processor(obs, proprio, texts)
    device = model.patch_pos.device
    if branches > 1:  # the search's copies share one render and one processor pass
        batch = {key: v.repeat_interleave(branches, 0) for key, v in batch.items()}
        proprio = proprio.repeat_interleave(branches, 0)
    batch = {key: v.to(device) for key, v in batch.items()}
    noise = torch.randn(
        (len(proprio), c.chunk_size, c.action_dim), generator=noise_gen, device=device
    )
    chunk = model.sample_actions(batch, noise=noise * noise_scale).cpu()
    actions = processor.actions_from_model(chunk, proprio)[:, : k or c.n_action_steps]
    # a host array, not a DLPack view: the jitted env step moves it to the sim's device
    return jnp.asarray(actions.clamp(-1.0, 1.0).transpose(0, 1).numpy())


def best_branches(success: np.ndarray, reward: np.ndarray, branches: int) -> np.ndarray:
    """Indices [B] into B · `branches` env-major copies: per env, the copy with the highest
    summed reward [K, B · branches] among those whose chunk succeeded (success > 0 at some step),
    or among all if none did; ties to the first copy, NaN sums last."""
    total = np.nan_to_num(reward.sum(0), nan=-np.inf)
    score = total + np.where(success.max(0) > 0, 1e9, 0.0)
    return score.reshape(-1, branches).argmax(1) + branches * np.arange(len(total) // branches)


def _summarize(success: list, done: list, reward: list, hold: int, t_max: int) -> dict[str, Any]:
    """Episode results from per-chunk success / done / reward [K, B] (as `vla.collect`)."""
    from vla.collect import episode_length

    success = np.concatenate(success)[:t_max].T
    done = np.concatenate(done)[:t_max].T
    reward = np.concatenate(reward)[:t_max].T
    lengths = [episode_length(s, d, hold) for s, d in zip(success, done, strict=True)]
    ok = [bool(success[i, n - 1] > 0) for i, n in enumerate(lengths)]
    return {
        "success_rate": float(np.mean(ok)),
        "mean_return": float(np.mean([reward[i, :n].sum() for i, n in enumerate(lengths)])),
        "mean_length": float(np.mean(lengths)),
        "episodes": len(ok),
        "success": ok,
        "first_success": [int(np.argmax(s > 0)) if (s > 0).any() else -1 for s in success],
    }


def _all_finished(success: np.ndarray, done: np.ndarray, hold: int) -> bool:
    """Whether every episode's recorded length (`episode_length`) is already fixed by the
    steps so far, success / done [T, B]."""
    t = len(success)
    for s, d in zip(success.T, done.T, strict=True):
        first = np.flatnonzero(s > 0)
        if not ((len(first) and first[0] + 1 + hold <= t) or (d > 0).any()):
            return False
    return True


def _render(renderer, state, colours: list[str], cube_geom: int, palette: dict) -> np.ndarray:
    """[B, H, W · cams, 3] uint8 images of a batched env state, each cube in its colour."""
    import jax

    data = jax.device_get(state.data)
    qpos, mocap = data.physics.qpos, data.physics.mocap_pos
    half = np.asarray(data.params.cube_half_size)
    shape = (len(colours), renderer.height, renderer.width * len(renderer.cameras), 3)
    out = np.empty(shape, np.uint8)
    for colour in sorted(set(colours)):
        idx = np.array([i for i, c in enumerate(colours) if c == colour])
        renderer.model.geom_rgba[cube_geom] = palette[colour]
        out[idx] = renderer.render(qpos[idx], mocap[idx], half[idx])
    return out
