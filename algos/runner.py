"""Training and evaluation shells over a run folder (`algos.run_folder`); the CLI calls these.

`train(cfg, run_dir)` starts a run, resumes it from its latest checkpoint, or reports it complete;
it jits the learner's pure `update` at this edge and keeps the Python outer loop to logging
(rich progress bar, metrics.csv, TensorBoard, learning-curve PNG, run.log), checkpoints and the
final evaluation. `evaluate_run(run_dir)` rebuilds the policy from the folder alone and runs the
evaluation protocol of `EvalConfig` with the deterministic policy.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import io
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from algos.config_io import from_dict, to_dict
from algos.evaluate import eval_steps, plot_trajectories, rollout, summarize
from algos.presets import TrainConfig
from algos.run_folder import (
    CONFIG,
    EVAL,
    LEARNERS,
    METRICS,
    VALIDATION,
    Checkpoint,
    MetricsLog,
    RunError,
    atomic_write,
    checkpoint_path,
    config_diff,
    config_hash,
    format_diff,
    is_empty_dir,
    latest_checkpoint,
    load_checkpoint,
    load_run,
    make_run_policy,
    make_train_env,
    read_config,
    read_json,
    read_metrics,
    remove_stale_temp_files,
    run_batch,
    save_checkpoint,
    trim_metrics,
    write_config,
)

LOG = "run.log"
PLOT_EVERY_S = 30.0
"""Seconds between redraws of learning_curve.png at checkpoints, counted from the session's
first update; the last checkpoint of a session always redraws. A redraw costs ~0.2 s, the first
with matplotlib's import ~1 s: at 10 s, the README main job (12–17 s of updates on a slow 2-core
machine) redrew once mid-run, 1.3 s of its clock."""
LEARNING_CURVE = "learning_curve.png"
EVAL_PLOT = "eval_trajectories.png"


class TrainResult(NamedTuple):
    """update: completed updates; total: updates of the full run; eval: summary once complete."""

    update: int
    total: int
    eval: dict[str, Any] | None


# -- compilation cache ------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """$HOVERFLY_CACHE_DIR, else $XDG_CACHE_HOME/hoverfly/jax, else ~/.cache/hoverfly/jax."""
    if os.environ.get("HOVERFLY_CACHE_DIR"):
        return Path(os.environ["HOVERFLY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hoverfly" / "jax"


def enable_compilation_cache(cache_dir: Path | None | Literal["default"] = "default") -> None:
    """Turns on JAX's persistent compilation cache for every compile (None: leave JAX as is).

    JAX reads the directory once per process, so a directory already configured (e.g. through
    $JAX_COMPILATION_CACHE_DIR or an earlier call) is kept.
    """
    if cache_dir is None or jax.config.jax_compilation_cache_dir:
        return
    if cache_dir == "default":
        cache_dir = default_cache_dir()
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def _cache_entries() -> int | None:
    folder = jax.config.jax_compilation_cache_dir
    if not folder or not Path(folder).is_dir():
        return None
    return sum(1 for p in Path(folder).iterdir() if p.name.endswith("-cache"))


def _cache_report(before: int | None) -> str:
    after = _cache_entries()
    if before is None or after is None:
        return "compilation cache off"
    new = after - before
    return f"compilation cache {'cold' if new else 'warm'}: {new} new entries"


# -- logging ----------------------------------------------------------------------------------
class _Log:
    """Lines to the console (stderr by default) and, time-stamped, to RUN/run.log."""

    def __init__(self, run_dir: Path, console: Console):
        self.path, self.console = Path(run_dir) / LOG, console

    def __call__(self, msg: str) -> None:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        with open(self.path, "a") as f:
            f.write(f"{stamp} {msg}\n")
        self.console.print(msg, markup=False, highlight=False, soft_wrap=True)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
        TextColumn("{task.fields[sps]:,.0f} steps/s"),
        TextColumn("return {task.fields[ret]:.1f}"),
        TextColumn("term {task.fields[term]:.1%}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


# -- training ---------------------------------------------------------------------------------
def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    cache_dir: Path | None | Literal["default"] = "default",
    stop_after: int | None = None,
    console: Console | None = None,
) -> TrainResult:
    """Trains `cfg` into `run_dir`, resuming from its latest checkpoint if there is one.

    A folder whose config.json differs from `cfg` is refused (`RunError` naming the fields); a
    complete run is not retrained (it is evaluated if eval.json is missing). `stop_after` ends
    this session after that many updates (with a checkpoint). `cache_dir`: JAX's persistent
    compilation cache ("default": `default_cache_dir()`, None: leave JAX's setting alone).
    """
    console = console or Console(stderr=True)
    run_dir = Path(run_dir)
    enable_compilation_cache(cache_dir)
    try:
        cfg.validate()
        _validate_run_fields(cfg)
        learner = LEARNERS[cfg.algo]
        env = make_train_env(cfg)
        trainer = learner.make_train(cfg.learner, env, cfg.env_config.episode_steps)
    except ValueError as e:
        raise RunError(str(e)) from None
    cfg_hash = _open_run(cfg, run_dir)
    opts = env.compiler_options
    init = jax.jit(trainer.init, compiler_options=opts)
    like = jax.eval_shape(init, jax.random.key(cfg.seed))  # the train state's shapes
    ckpt_path, ckpt = latest_checkpoint(run_dir), None
    if ckpt_path is not None:  # validated before anything in the folder changes
        ckpt = load_checkpoint(ckpt_path, like.params, like.opt_state, cfg_hash)
    total, log = cfg.learner.num_updates, _Log(run_dir, console)
    if ckpt is not None and (ckpt.update >= total or _validated(cfg, run_dir, ckpt.update)):
        log(f"run {run_dir} is complete ({ckpt.update}/{total} updates); not retraining")
        return TrainResult(ckpt.update, total, _final_eval(run_dir, ckpt.update, log, console))
    remove_stale_temp_files(run_dir)
    for name in (METRICS, VALIDATION):
        trim_metrics(run_dir, ckpt.update if ckpt else 0, name)
    cache_before, t_start = _cache_entries(), time.perf_counter()
    update = _compile_update(trainer.update, opts, like)
    ts = _start_state(init, cfg, ckpt, cfg_hash, log)
    timing = (t_start, time.perf_counter() - t_start, cache_before)
    end = total if stop_after is None else min(total, int(ts.update) + stop_after)
    ts = _loop(
        update,
        lambda: _make_validation(cfg, env, trainer.network),
        cfg,
        run_dir,
        ts,
        end,
        cfg_hash,
        log,
        console,
        timing,
    )
    update = int(ts.update)
    steps = f"{update:,} updates, {update * cfg.steps_per_update:,} env steps"
    if update < total and _validated(cfg, run_dir, update):
        log(f"training complete: validation success ≥ {cfg.validation.stop_at:.1%} after {steps}")
    elif update < total:
        log(f"stopped at update {update}/{total}; run the same command again to resume")
        return TrainResult(update, total, None)
    else:
        log(f"training complete: {steps}")
    return TrainResult(update, total, _final_eval(run_dir, update, log, console))


def _validated(cfg: TrainConfig, run_dir: Path, update: int) -> bool:
    """Whether the validation of update `update` reached `cfg.validation.stop_at` (an early stop:
    the run is complete at that checkpoint)."""
    if not cfg.validation.every:
        return False
    return any(
        int(r["update"]) == update and r["success_rate"] >= cfg.validation.stop_at
        for r in read_metrics(run_dir, VALIDATION)
    )


def _make_validation(cfg: TrainConfig, env, network):
    """validate(params) -> eval summary of the deterministic policy on the validation episodes
    (`cfg.validation`: the eval protocol with its own key), or None when validation is off."""
    v = cfg.validation
    if not v.every:
        return None
    steps, settle = eval_steps(cfg.eval, env.dt)
    key = jax.random.key(v.seed)
    run = _episodes(cfg.algo, network, env, v.episodes, steps)
    # Compiled on a second thread while training runs (the first validation would otherwise wait
    # ~3 s for it on the CPU, a sixth of a quadrotor APG run).
    compiled = _compile_in_background(run, jax.eval_shape(network.init, key), key)
    return lambda params: summarize(compiled.result()(params, key), settle, cfg.eval.tolerance)


def _compile_in_background(jitted, *args) -> concurrent.futures.Future:
    """`jitted.lower(*args).compile()` (`args` may be shapes) on a second thread."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    compiled = pool.submit(lambda: jitted.lower(*args).compile())
    pool.shutdown(wait=False)
    return compiled


def _episodes(algo: str, network, env, episodes: int, steps: int):
    """Jitted run(params, key) -> `rollout` trajectories of the deterministic policy (the eval
    protocol's episodes, for `evaluate_run` and the validations)."""

    def run(params, key):
        policy = make_run_policy(algo, network, params, deterministic=True)
        return rollout(env, policy, key, episodes, steps)

    return jax.jit(run, compiler_options=env.compiler_options)


def _validate_run_fields(cfg: TrainConfig) -> None:
    """Checks what `TrainConfig.validate` leaves alone: field types (config.json must read back
    as the same config) and the fields this module relies on."""
    if from_dict(TrainConfig, json.loads(json.dumps(to_dict(cfg)))) != cfg:
        raise ValueError("the config does not survive a round trip through config.json")
    e = cfg.eval
    if cfg.checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be ≥ 1, got {cfg.checkpoint_every}")
    if e.episodes < 1 or not 0 < e.settle_seconds <= e.seconds:
        raise ValueError("eval needs episodes ≥ 1 and 0 < settle_seconds ≤ seconds")


def _start_state(init, cfg: TrainConfig, ckpt: Checkpoint | None, cfg_hash: str, log):
    """A fresh train state (PPO's or SAC's), or the checkpoint's with env states (and SAC's
    replay buffer) re-initialized."""
    total = cfg.learner.num_updates
    if ckpt is None:
        log(
            f"start {cfg.task} · {cfg.algo} · {total} updates × {cfg.steps_per_update:,} env "
            f"steps · seed {cfg.seed} · config {cfg_hash}"
        )
        return init(jax.random.key(cfg.seed))
    refill = f"; replay refills to {cfg.sac.learning_starts:,}" if cfg.algo == "sac" else ""
    log(f"resume from {ckpt.path.name} (update {ckpt.update}/{total}{refill})")
    # Env states and the replay buffer are not checkpointed: fresh ones from a key derived
    # from the checkpoint's.
    fresh = init(jax.random.fold_in(ckpt.key, ckpt.update))
    return fresh.replace(
        params=jax.tree.map(jnp.asarray, ckpt.params),
        opt_state=jax.tree.map(jnp.asarray, ckpt.opt_state),
        key=ckpt.key,
        update=jnp.asarray(ckpt.update, jnp.int32),
    )


def _open_run(cfg: TrainConfig, run_dir: Path) -> str:
    """Checks `cfg` against an existing config.json, or creates the folder and writes it."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunError(f"{run_dir} exists and is not a folder")
    if (run_dir / CONFIG).exists():
        diff = config_diff(read_config(run_dir), cfg)
        if diff:
            raise RunError(
                f"{run_dir / CONFIG} differs from the requested config: "
                f"{format_diff(diff)}; use another --out or the run's settings"
            )
    elif run_dir.is_dir() and not is_empty_dir(run_dir):
        raise RunError(f"{run_dir} is not empty and has no {CONFIG}; refusing to train into it")
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run_dir, cfg)
    return config_hash(cfg)


def _compile_update(update_fn, compiler_options: dict, like):
    """The jitted `update_fn`, compiled on a second thread from the train state's shapes `like`
    while the init compiles and runs (the arm's MJX programs took 55 s and 10 s to compile from
    a cold cache on the H200). A replay buffer in the state (SAC's) is donated so that it is
    written in place; the rest of the state is not, so the last logged state stays valid for the
    checkpoint written on an interrupt."""
    if hasattr(like, "replay"):
        jitted = jax.jit(
            lambda replay, ts: update_fn(ts.replace(replay=replay)),
            donate_argnums=0,
            compiler_options=compiler_options,
        )

        def args(ts):
            return ts.replay, ts.replace(replay=None)
    else:
        jitted = jax.jit(update_fn, compiler_options=compiler_options)

        def args(ts):
            return (ts,)

    compiled = _compile_in_background(jitted, *args(like))
    return lambda ts: compiled.result()(*args(ts))


def _loop(update_fn, make_validate, cfg, run_dir, ts, end, cfg_hash, log, console, timing):
    """Runs the jitted `update_fn` until `end`; one metrics row per update, checkpoints every
    few. Validations (`make_validate()`, called after the first update so that its compilation
    overlaps training; None: off) where `cfg.validation` has them due and at the last update:
    an early end (with a checkpoint) once one reaches `cfg.validation.stop_at`; the best
    validated checkpoint is kept, and if the budget ends below it, the final checkpoint holds its
    parameters."""
    batch, total, start = cfg.steps_per_update, cfg.learner.num_updates, int(ts.update)
    metrics_log, validation_log = MetricsLog(run_dir), MetricsLog(run_dir, VALIDATION)
    previous = read_metrics(run_dir)
    wall0 = previous[-1].get("wall_time_s", 0.0) if previous else 0.0
    writer = _summary_writer(run_dir / "tb", purge_step=start * batch + 1)
    saved, t_first, stats = ts, None, {"sps": 0.0, "ret": float("nan"), "term": float("nan")}
    plotted = math.inf  # set at the first update
    t_start, t_init, cache_before = timing
    # (success, update) of the best validation so far; its checkpoint is kept for the end
    best = max(
        ((r["success_rate"], int(r["update"])) for r in read_metrics(run_dir, VALIDATION)),
        default=(-1.0, None),
    )
    spent = dict.fromkeys(("updates", "validations", "checkpoints"), 0.0)
    try:
        with _progress(console) as progress:
            task = progress.add_task(
                f"train {cfg.task}", total=total * batch, completed=start * batch, **stats
            )
            for u in range(start + 1, end + 1):
                t0 = time.perf_counter()
                ts, metrics = update_fn(ts)
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                now = time.perf_counter()
                if t_first is not None:
                    spent["updates"] += now - t0
                else:
                    t_first, plotted, validate = now, now, make_validate()
                    log(
                        f"time to first update {now - t_start:.1f} s (init {t_init:.1f} s; "
                        f"{_cache_report(cache_before)})"
                    )
                row = {
                    "update": u,
                    "env_steps": u * batch,
                    "wall_time_s": round(wall0 + now - t_start, 3),
                    **metrics,
                }
                metrics_log.append(row)
                _add_scalars(writer, metrics, u * batch)
                saved, stats = (
                    ts,
                    _stats(stats, metrics, batch / max(now - t0, 1e-9), first=u == start + 1),
                )
                progress.update(task, completed=u * batch, **stats)
                stop = False
                if validate is not None and (cfg.validation.due(u) or u == total):
                    t0 = time.perf_counter()
                    summary = validate(ts.params)
                    validation_log.append({"update": u, "env_steps": u * batch, **summary})
                    keys = ("success_rate", "pos_rmse_m", "termination_rate")
                    _add_scalars(writer, {f"validation/{k}": summary[k] for k in keys}, u * batch)
                    log(f"validation at update {u}: {format_summary(summary)}")
                    rate = summary["success_rate"]
                    stop = rate >= cfg.validation.stop_at
                    if rate >= best[0]:  # a tie goes to the later parameters
                        best = (rate, u)
                    elif u == total:  # the budget ends below the best validated policy
                        ckpt = load_checkpoint(checkpoint_path(run_dir, best[1]), ts.params)
                        ts = ts.replace(params=jax.tree.map(jnp.asarray, ckpt.params))
                        log(
                            f"final policy: the parameters of update {best[1]} (validation "
                            f"{best[0]:.1%}, against {rate:.1%} at the end)"
                        )
                    spent["validations"] += time.perf_counter() - t0
                if u % cfg.checkpoint_every == 0 or u == end or stop or best[1] == u:
                    plot = u == end or stop or now - plotted >= PLOT_EVERY_S
                    plotted = now if plot else plotted
                    t0 = time.perf_counter()
                    _checkpoint(
                        run_dir, ts, cfg_hash, writer, log, total, batch, stats, best[1], plot
                    )
                    spent["checkpoints"] += time.perf_counter() - t0
                if stop:
                    break
        if t_first is not None:
            _log_clock(log, spent, int(ts.update) - start - 1, t_start, t_first)
    except KeyboardInterrupt:
        if int(saved.update) > start:
            _checkpoint(run_dir, saved, cfg_hash, writer, log, total, batch, stats, best[1])
        log(f"interrupted at update {int(saved.update)}/{total}; run the same command to resume")
        raise
    finally:
        writer.close()
    return ts


def _log_clock(log, spent: dict[str, float], updates: int, t_start: float, t_first: float) -> None:
    """One run.log line: the seconds from `t_start` to the first update (at `t_first`), then
    where the session's clock went (`spent` on the `updates` after the first, and the rest)."""
    rest = time.perf_counter() - t_first - sum(spent.values())
    each = 1e3 * spent["updates"] / max(updates, 1)
    log(
        f"clock: {t_first - t_start:.1f} s to the first update, then {updates} updates "
        f"{spent['updates']:.1f} s ({each:.1f} ms each), validations "
        f"{spent['validations']:.1f} s, checkpoints and plots {spent['checkpoints']:.1f} s, "
        f"logging and the rest {rest:.1f} s"
    )


def _add_scalars(writer, scalars: dict[str, float], step: int) -> None:
    """`scalars` as one TensorBoard event, through the file writer that `add_scalar` uses:
    `add_scalar` per value took 1.6 ms per update here (19 values; 0.8 s of a 500-update CPU
    run), one event of 19 values 0.14 ms."""
    from tensorboardX.proto.summary_pb2 import Summary

    values = [Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
    writer._get_file_writer().add_summary(Summary(value=values), step)


def _summary_writer(folder: Path, purge_step: int):
    """A tensorboardX SummaryWriter on `folder`, imported without torch: tensorboardX imports
    torch when it is installed (the [vla] extra) only to name a type hint, ~1 s of a CPU run's
    clock here. A torch already loaded is left alone."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter(str(folder), purge_step=purge_step)


def _stats(prev: dict, metrics: dict, sps: float, first: bool) -> dict[str, float]:
    """Progress figures: learner steps/s (EMA; the compiling first update excluded) and the
    return and termination rate of the latest rollout in which episodes ended."""
    out = dict(prev)
    if not first:
        out["sps"] = sps if prev["sps"] == 0 else 0.9 * prev["sps"] + 0.1 * sps
    if metrics.get("episode/count", 1.0) > 0:
        out["ret"] = metrics.get("episode/return", 0.0)
        out["term"] = metrics.get("episode/termination_rate", 0.0)
    return out


def _checkpoint(
    run_dir, ts, cfg_hash, writer, log, total, batch, stats, protect, plot=True
) -> None:
    u = int(ts.update)
    path = save_checkpoint(run_dir, u, ts.params, ts.opt_state, ts.key, cfg_hash, protect=protect)
    writer.flush()
    if plot:
        plot_learning_curve(run_dir)
    log(
        f"update {u}/{total} · {u * batch:,} env steps · {stats['sps']:,.0f} steps/s · "
        f"return {stats['ret']:.1f} · termination {stats['term']:.1%} → {path.name}"
    )


def plot_learning_curve(run_dir: Path) -> None:
    """RUN/learning_curve.png from metrics.csv: return, termination rate, position error and,
    where the env reports it, success (the share of rollout steps at the goal)."""
    from matplotlib.figure import Figure

    rows = read_metrics(run_dir)
    if not rows:
        return
    x = np.array([r["env_steps"] for r in rows])
    panels = [
        ("episode/return", "episode return"),
        ("episode/termination_rate", "termination rate"),
        ("position_error", "position error [m]"),
        ("success", "success (share of rollout steps)"),
    ]
    panels = [(k, label) for k, label in panels if k in rows[0]]
    validation = read_metrics(run_dir, VALIDATION)
    if validation:
        panels.append(("success_rate", "validation success"))
    fig = Figure(figsize=(4.5 * len(panels), 3.5), layout="constrained")
    for ax, (k, label) in zip(np.atleast_1d(fig.subplots(1, len(panels))), panels, strict=True):
        if k == "success_rate":
            vx, vy = (np.array([r[f] for r in validation]) for f in ("env_steps", k))
            ax.plot(vx, vy, "o-", lw=1.0)
        else:  # episode statistics exist only for rollouts in which episodes ended
            y = np.array([r[k] for r in rows], np.float64)
            ended = [not k.startswith("episode/") or r.get("episode/count", 1) for r in rows]
            keep = np.isfinite(y) & np.array(ended, bool)
            # long episodes end in few rollouts: dots, since NaN gaps would hide a line's points
            ax.plot(x[keep], y[keep], lw=1.0, marker="." if keep.mean() < 0.5 else None)
        ax.set(xlabel="env steps", ylabel=label)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    atomic_write(Path(run_dir) / LEARNING_CURVE, buf.getvalue())


def _final_eval(run_dir: Path, update: int, log: _Log, console: Console) -> dict[str, Any]:
    """eval.json of the final checkpoint, evaluating it if missing or stale."""
    doc = read_json(run_dir / EVAL)
    if doc is not None and doc.get("update") == update:
        log(f"eval.json: {format_summary(doc)}")
        return {k: doc[k] for k in SUMMARY_KEYS if k in doc}
    return evaluate_run(run_dir, cache_dir=None, console=console)


# -- evaluation -------------------------------------------------------------------------------
SUMMARY_KEYS = ("success_rate", "pos_rmse_m", "termination_rate", "episodes")


def evaluate_run(
    run_dir: Path,
    *,
    episodes: int | None = None,
    cache_dir: Path | None | Literal["default"] = "default",
    console: Console | None = None,
) -> dict[str, Any]:
    """Evaluates the run's latest checkpoint with the deterministic policy (EvalConfig protocol).

    Writes RUN/eval_trajectories.png, and RUN/eval.json when `episodes` is the protocol's own.
    `cache_dir` as in `train`. Returns {success_rate, pos_rmse_m, termination_rate, episodes}.
    """
    console = console or Console(stderr=True)
    run_dir = Path(run_dir)
    enable_compilation_cache(cache_dir)
    run = load_run(run_dir)
    cfg = run.config.eval
    n = cfg.episodes if episodes is None else episodes
    if n < 1:
        raise RunError(f"episodes must be ≥ 1, got {n}")
    log = _Log(run_dir, console)
    steps, settle = eval_steps(cfg, run.env.dt)
    # more episodes than the run's largest batch: an MJX-Warp contact pool for them
    env = run.env if n <= run_batch(run.config) else make_train_env(run.config, batch=n)

    cache_before, t0 = _cache_entries(), time.perf_counter()
    run_episodes = _episodes(run.config.algo, run.network, env, n, steps)
    traj = run_episodes(run.params, jax.random.key(cfg.seed))
    summary = summarize(traj, settle, cfg.tolerance)
    seconds = time.perf_counter() - t0
    sample = jax.device_get({k: v[:, :20] for k, v in traj.items()})
    plot_trajectories(sample, run.env.dt, cfg.tolerance, settle, run_dir / EVAL_PLOT)
    log(
        f"eval of update {run.update}: {format_summary(summary)} ({cfg.seconds:g} s episodes, "
        f"{seconds:.1f} s; {_cache_report(cache_before)})"
    )
    if n == cfg.episodes:
        doc = {
            **summary,
            "update": run.update,
            "protocol": to_dict(dataclasses.replace(cfg, episodes=n)),
        }
        atomic_write(run_dir / EVAL, json.dumps(doc, indent=2) + "\n")
    return summary


def format_summary(s: dict[str, Any]) -> str:
    """One line: success rate, position RMSE, termination rate, episodes."""
    return (
        f"success {s['success_rate']:.1%} · position RMSE {s['pos_rmse_m']:.3f} m · "
        f"termination {s['termination_rate']:.1%} over {s['episodes']} episodes"
    )
