"""The run folder: the contract between training and everything after it (export, deployment).

Layout of a run folder `RUN/`:
  config.json                  {"format", "config_hash", "config": resolved TrainConfig}
  checkpoints/ckpt_XXXXXXXX.msgpack   params, optimizer state, update counter, PRNG key data
  metrics.csv                  one row per update (column `update` is the completed-update count)
  tb/                          TensorBoard events
  learning_curve.png, eval.json, eval_trajectories.png, train.log

Every file is written atomically (temp file in the same folder + `os.replace`), so a killed process
leaves either the old or the new version. Consumers start from `load_run(path)`, which rebuilds the
env and the network from `config.json` + the latest checkpoint alone. Bad input raises `RunError`
with a one-line message naming the file and the problem.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from algos import apg, ppo, sac
from algos.config_io import ConfigError, from_dict, to_dict
from algos.presets import TrainConfig
from algos.residual import (
    BasePolicy,
    ResidualWrapper,
    base_from_run,
    field_layout,
    registered_base,
)
from policies import ActorCritic, make_policy
from policies.sac import SACNetworks, make_sac_policy
from sim import Env, make_env, manipulator, quadrotor

CONFIG = "config.json"
CHECKPOINTS = "checkpoints"
METRICS = "metrics.csv"
VALIDATION = "validation.csv"
EVAL = "eval.json"
CONFIG_FORMAT = "hoverfly-run/1"
CHECKPOINT_FORMAT = "hoverfly-checkpoint/1"
_CKPT_RE = re.compile(r"^ckpt_(\d{8})\.msgpack$")


class RunError(ValueError):
    """Bad input around a run folder; the message is one line naming the file and the problem."""


# -- atomic files -----------------------------------------------------------------------------
def atomic_write(path: Path, data: bytes | str) -> None:
    """Writes `data` to `path` through a temp file in the same folder and `os.replace`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    with open(tmp, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_stale_temp_files(run_dir: Path) -> None:
    """Deletes temp files left by a process killed mid-write."""
    for folder in (Path(run_dir), Path(run_dir) / CHECKPOINTS):
        for tmp in folder.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)


# -- config.json ------------------------------------------------------------------------------
def run_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as a dict without the sections it does not use (`TrainConfig.unused_sections`:
    a quadrotor PPO run's config.json and hash are those written before SAC and arms existed)."""
    return {k: v for k, v in to_dict(cfg).items() if k not in cfg.unused_sections}


def config_hash(cfg: TrainConfig) -> str:
    """sha256 (first 16 hex digits) of the canonical JSON of `run_dict(cfg)`."""
    text = json.dumps(run_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    doc = {"format": CONFIG_FORMAT, "config_hash": config_hash(cfg), "config": run_dict(cfg)}
    atomic_write(Path(run_dir) / CONFIG, json.dumps(doc, indent=2) + "\n")


def read_config(run_dir: Path) -> TrainConfig:
    """The run's resolved config; `RunError` if the folder or config.json is missing or bad."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run folder {run_dir} does not exist")
    path = run_dir / CONFIG
    if not path.is_file():
        raise RunError(f"{run_dir} is not a run folder (no {CONFIG})")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not {"config", "config_hash"} <= set(doc):
        raise RunError(f"{path}: expected an object with keys 'config' and 'config_hash'")
    try:
        cfg = from_dict(TrainConfig, doc["config"])
        cfg.validate()
    except (ConfigError, ValueError) as e:
        raise RunError(f"{path}: {e}") from None
    if doc["config_hash"] != config_hash(cfg):
        raise RunError(f"{path}: config_hash does not match the config (edited by hand?)")
    return cfg


def config_diff(a: TrainConfig, b: TrainConfig) -> list[tuple[str, Any, Any]]:
    """[(dotted field name, value in a, value in b)] for every field of `run_dict` that differs."""
    fa, fb = _flatten(run_dict(a)), _flatten(run_dict(b))
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def format_diff(diff: list[tuple[str, Any, Any]], limit: int = 5) -> str:
    """'seed (0 → 3), ppo.num_envs (512 → 64)', at most `limit` fields."""
    parts = [f"{k} ({a!r} → {b!r})" for k, a, b in diff[:limit]]
    if len(diff) > limit:
        parts.append(f"and {len(diff) - limit} more")
    return ", ".join(parts)


# -- checkpoints ------------------------------------------------------------------------------
class Checkpoint(NamedTuple):
    """update: completed updates. params/opt_state: pytrees shaped like the targets (numpy leaves).
    key: PRNG key of the next update. config_hash: hash of the config that wrote it."""

    path: Path
    update: int
    params: Any
    opt_state: Any
    key: jax.Array
    config_hash: str


def checkpoint_path(run_dir: Path, update: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"ckpt_{update:08d}.msgpack"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of the run, oldest first."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _CKPT_RE.match(p.name))


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(
    run_dir: Path,
    update: int,
    params: Any,
    opt_state: Any,
    key: jax.Array,
    cfg_hash: str,
    keep: int = 3,
    protect: int | None = None,
) -> Path:
    """Writes checkpoint `update` atomically and deletes all but the newest `keep` and that of
    update `protect` (the best validated one)."""
    key = jax.device_get(key)
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "config_hash": cfg_hash,
        "update": int(update),
        "key_impl": str(jax.random.key_impl(key)) if typed else "",
        "key_data": np.asarray(jax.random.key_data(key) if typed else key),
        "params": serialization.to_state_dict(jax.device_get(params)),
        "opt_state": serialization.to_state_dict(jax.device_get(opt_state)),
    }
    path = checkpoint_path(run_dir, update)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, serialization.msgpack_serialize(payload))
    for old in list_checkpoints(run_dir)[:-keep]:
        if protect is None or old != checkpoint_path(run_dir, protect):
            old.unlink(missing_ok=True)
    return path


def load_checkpoint(
    path: Path, params_like: Any, opt_state_like: Any = None, cfg_hash: str | None = None
) -> Checkpoint:
    """Restores a checkpoint into the structure of `params_like` (arrays or ShapeDtypeStructs).

    The optimizer state is restored only when `opt_state_like` is given. Raises `RunError` for an
    unreadable file, missing or extra keys, wrong shapes or dtypes, or a different config hash.
    """
    path = Path(path)
    try:
        state = serialization.msgpack_restore(path.read_bytes())
    except OSError as e:
        raise RunError(f"checkpoint {path}: {e.strerror or e}") from None
    except Exception as e:  # msgpack raises several types for truncated or garbled input
        raise RunError(f"checkpoint {path} is unreadable (truncated or corrupt: {e})") from None
    required = {"format", "config_hash", "update", "key_impl", "key_data", "params", "opt_state"}
    if not isinstance(state, dict) or not required <= set(state):
        missing = sorted(required - set(state)) if isinstance(state, dict) else sorted(required)
        raise RunError(f"checkpoint {path}: missing {', '.join(missing)}")
    if state["format"] != CHECKPOINT_FORMAT:
        raise RunError(f"checkpoint {path}: unknown format {state['format']!r}")
    if cfg_hash is not None and state["config_hash"] != cfg_hash:
        raise RunError(
            f"checkpoint {path} was written by a different config "
            f"(hash {state['config_hash']}, config.json has {cfg_hash})"
        )
    params = _restore(path, "params", params_like, state["params"])
    opt_state = None
    if opt_state_like is not None:
        opt_state = _restore(path, "opt_state", opt_state_like, state["opt_state"])
    try:
        data = np.asarray(state["key_data"], np.uint32)
        key = jax.random.wrap_key_data(data, impl=state["key_impl"]) if state["key_impl"] else data
    except Exception as e:
        raise RunError(f"checkpoint {path}: bad PRNG key ({e})") from None
    return Checkpoint(path, int(state["update"]), params, opt_state, key, state["config_hash"])


def _restore(path: Path, name: str, like: Any, state: Any) -> Any:
    _check_tree(path, name, serialization.to_state_dict(like), state)
    return serialization.from_state_dict(like, state)


def _check_tree(path: Path, name: str, want: Any, got: Any) -> None:
    """Raises `RunError` naming the first key or leaf where `got` does not match `want`."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            raise RunError(f"checkpoint {path}: {name} should be a mapping")
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        if missing or extra:
            what = f"missing {name}.{missing[0]}" if missing else f"unexpected {name}.{extra[0]}"
            raise RunError(f"checkpoint {path}: {what}")
        for k in want:
            _check_tree(path, f"{name}.{k}", want[k], got[k])
        return
    shape, dtype = tuple(want.shape), np.dtype(want.dtype)
    if not isinstance(got, np.ndarray | np.generic) or got.shape != shape or got.dtype != dtype:
        found = f"{got.dtype}{list(got.shape)}" if hasattr(got, "shape") else type(got).__name__
        raise RunError(f"checkpoint {path}: {name} is {found}, expected {dtype}{list(shape)}")


# -- metrics.csv ------------------------------------------------------------------------------
class MetricsLog:
    """Appends one row per update to metrics.csv (or `name`, e.g. validation.csv); the header is
    fixed by the first row."""

    def __init__(self, run_dir: Path, name: str = METRICS):
        self.path = Path(run_dir) / name
        self.fields: list[str] | None = None
        if self.path.is_file() and self.path.stat().st_size:
            with open(self.path, newline="") as f:
                self.fields = next(csv.reader(f), None)

    def append(self, row: dict[str, float]) -> None:
        new = self.fields is None
        if new:
            self.fields = list(row)
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, self.fields, restval="", extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(row)


def read_metrics(run_dir: Path, name: str = METRICS) -> list[dict[str, float]]:
    """Complete rows of metrics.csv (or `name`) as floats (a partial last line is skipped)."""
    path = Path(run_dir) / name
    if not path.is_file():
        return []
    header, rows = _parse_metrics(path.read_text())
    return [{k: _float(v) for k, v in zip(header, r, strict=True)} for r in rows]


def trim_metrics(run_dir: Path, last_update: int, name: str = METRICS) -> None:
    """Drops rows of metrics.csv (or `name`) past `last_update` (written after the last
    checkpoint) and partial lines."""
    path = Path(run_dir) / name
    if not path.is_file():
        return
    text = path.read_text()
    header, rows = _parse_metrics(text)
    keep = [r for r in rows if int(float(r[0])) <= last_update]
    out = io.StringIO()
    if header:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(keep)
    if out.getvalue() != text:
        atomic_write(path, out.getvalue())


def _parse_metrics(text: str) -> tuple[list[str], list[list[str]]]:
    lines = text.splitlines(keepends=True)
    complete = [ln for ln in lines if ln.endswith("\n")]
    parsed = list(csv.reader(complete))
    if not parsed or not parsed[0] or parsed[0][0] != "update":
        return [], []
    header = parsed[0]
    return header, [r for r in parsed[1:] if len(r) == len(header) and _is_int(r[0])]


def _is_int(s: str) -> bool:
    try:
        return float(s) == int(float(s))
    except ValueError:
        return False


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return float("nan")


# -- loading a run ----------------------------------------------------------------------------
LEARNERS = {"ppo": ppo, "sac": sac, "apg": apg}
"""The learner package of each `TrainConfig.algo`."""


class Run(NamedTuple):
    """A trained run rebuilt from its folder alone.

    config: resolved TrainConfig. params: the learner's params (normalizers included; the actor
    under "actor", its input normalizer under "obs_norm").
    network: PPO's ActorCritic or SAC's SACNetworks; `make_run_policy(config.algo, network,
    params)` is the deterministic policy of either (PPO: `policies.make_policy`).
    env: the unbatched training env (domain randomization included). update: the checkpoint's
    completed updates. path: the run folder.
    """

    config: TrainConfig
    params: Any
    network: ActorCritic | SACNetworks
    env: Env
    update: int
    path: Path


def make_env_and_network(cfg: TrainConfig) -> tuple[Env, ActorCritic | SACNetworks]:
    """The unbatched training env and the (untrained) network a config describes."""
    env = make_train_env(cfg)
    return env, LEARNERS[cfg.algo].make_network(cfg.learner, env)


def run_batch(cfg: TrainConfig) -> int:
    """The most envs a run steps as one batch: the learner's, the validation's or the eval's."""
    validation = cfg.validation.episodes if cfg.validation.every else 0
    return max(cfg.learner.num_envs, validation, cfg.eval.episodes)


def make_train_env(cfg: TrainConfig, batch: int | None = None) -> Env:
    """The task's env with its family's randomization (and an arm's perturbations), inside the
    residual wrapper of a residual run (`TrainConfig.residual`). Raises `ValueError` for a base
    that does not fit the task. An arm on MJX-Warp without `scene.warp_envs` gets its contact
    pool sized for `batch` envs (default `run_batch(cfg)`)."""
    env_cfg = cfg.env_config
    if cfg.family == "arm" and env_cfg.scene.impl == "warp" and env_cfg.scene.warp_envs is None:
        scene = dataclasses.replace(env_cfg.scene, warp_envs=batch or run_batch(cfg))
        env_cfg = dataclasses.replace(env_cfg, scene=scene)
    env = make_env(cfg.task, env_cfg, cfg.randomization_config)
    if cfg.family == "arm" and cfg.arm_perturbation.episode_prob > 0:
        env = manipulator.Perturbation(env, cfg.arm_perturbation)
    r = cfg.residual
    if r.base == "none":
        return env
    if cfg.family == "arm":
        arm = env.unwrapped
        layout = field_layout(manipulator.obs_fields(arm.action_size))
    else:
        layout = field_layout(quadrotor.OBS_FIELDS)
    return ResidualWrapper(env, _residual_base(cfg, env), r.scale, r.augmentation, layout)


def _residual_base(cfg: TrainConfig, env: Env) -> BasePolicy:
    base = cfg.residual.base
    if base == "controller":
        if cfg.family != "quadrotor":
            raise ValueError(f'residual base "controller" flies quadrotors, not {cfg.task}')
        return quadrotor.make_controller(quadrotor.ControllerConfig(), env.dt)
    if base == "scripted":
        if cfg.family != "arm":
            raise ValueError(f'residual base "scripted" drives the arm, not {cfg.task}')
        return manipulator.make_scripted_base(env.unwrapped)
    if base != "run":  # a base registered by a package above algos/ (e.g. "vla" by vla.residual)
        return registered_base(base)(cfg.residual.base_run, env)
    run = load_run(Path(cfg.residual.base_run))
    if run.config.task != cfg.task:
        raise ValueError(
            f"residual base run {cfg.residual.base_run} was trained on {run.config.task}, "
            f"not {cfg.task}"
        )
    return base_from_run(run)


def make_run_policy(
    algo: str, network: ActorCritic | SACNetworks, params: Any, deterministic: bool = True
) -> Callable:
    """policy(obs [..., obs], key) -> (action [..., A] in [−1, 1], extras) of a run's learner:
    PPO's and APG's clipped Gaussian mean, SAC's tanh(mean) (sampled ones with
    `deterministic=False`)."""
    if algo == "sac":
        return make_sac_policy(network, params, deterministic)
    return make_policy(network, params, deterministic)


def load_run(run_dir: Path, checkpoint: Path | None = None) -> Run:
    """Rebuilds config, env, network and params from config.json + a checkpoint (the latest)."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    path = checkpoint or latest_checkpoint(run_dir)
    if path is None:
        raise RunError(f"{run_dir} has no checkpoint yet (train it first)")
    env, network = make_env_and_network(cfg)
    params_like = jax.eval_shape(network.init, jax.random.key(0))
    ckpt = load_checkpoint(path, params_like, cfg_hash=config_hash(cfg))
    params = jax.tree.map(jnp.asarray, ckpt.params)
    return Run(cfg, params, network, env, ckpt.update, run_dir)


def read_json(path: Path) -> dict | None:
    """A JSON object from `path`, or None if the file is missing or unreadable."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def is_empty_dir(path: Path, ignore: Iterable[str] = ()) -> bool:
    return not any(p.name not in set(ignore) for p in Path(path).iterdir())
