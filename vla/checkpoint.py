"""Checkpoints of the compact VLA in lerobot's folder layout:

    <dir>/config.json         HoverflyVLAConfig.to_dict() plus "type": "hoverfly_vla"
    <dir>/model.safetensors   the model's state dict (float tensors, names as in `state_dict()`)
    <dir>/processor.json      HoverflyVLAProcessor.to_dict(): tokenizer, image size, cameras,
                              norm stats with their action representation
    <dir>/train_state.pt      optional: optimizer state, step, ... (torch.save, weights_only load)

Saving writes everything into a hidden temporary folder beside `<dir>` and renames it into place, so
a crash never leaves a half-written checkpoint under `<dir>` (an existing `<dir>` is replaced).
Loading validates every file and raises ValueError naming the file and the bad field or tensor.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vla.configuration_hoverfly_vla import HoverflyVLAConfig
from vla.modeling_hoverfly_vla import HoverflyVLA
from vla.processor_hoverfly_vla import HoverflyVLAProcessor

__all__ = [
    "CONFIG_NAME",
    "PROCESSOR_NAME",
    "TRAIN_STATE_NAME",
    "WEIGHTS_NAME",
    "load_checkpoint",
    "latest_checkpoint",
    "load_train_state",
    "prune_checkpoints",
    "resolve_checkpoint",
    "run_checkpoints",
    "save_checkpoint",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PROCESSOR_NAME = "processor.json"
TRAIN_STATE_NAME = "train_state.pt"
_TYPE = "hoverfly_vla"


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def replace_dir(tmp: Path, path: Path) -> None:
    """Moves the finished folder `tmp` to `path`, replacing an existing `path`: old aside, new in,
    old removed (both renames are atomic)."""
    if path.exists():
        old = path.parent / f".{path.name}.old-{uuid.uuid4().hex}"
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def save_checkpoint(
    path: str | os.PathLike,
    model: HoverflyVLA,
    processor: HoverflyVLAProcessor,
    train_state: Mapping[str, Any] | None = None,
) -> Path:
    """Writes `model`, `processor` (and `train_state`, e.g. {"step": int, "optimizer":
    optimizer.state_dict()}) as a checkpoint folder at `path`, atomically. Returns the path."""
    path = Path(path)
    if processor.config != model.config:
        raise ValueError("processor.config differs from model.config")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path}: exists and is not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        _write_json(tmp / CONFIG_NAME, {"type": _TYPE, **model.config.to_dict()})
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
        _write_json(tmp / PROCESSOR_NAME, processor.to_dict())
        if train_state is not None:
            torch.save(dict(train_state), tmp / TRAIN_STATE_NAME)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _read_json(file: Path) -> Any:
    if not file.is_file():
        raise ValueError(f"{file}: missing checkpoint file")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from e


def _load_config(file: Path) -> HoverflyVLAConfig:
    data = _read_json(file)
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object")
    data = dict(data)
    kind = data.pop("type", None)
    if kind != _TYPE:
        raise ValueError(f"{file}: field 'type' is {kind!r}, expected {_TYPE!r}")
    try:
        return HoverflyVLAConfig.from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{file}: {e}") from e


def _load_weights(file: Path, model: HoverflyVLA) -> dict[str, torch.Tensor]:
    """State dict from `file`, checked against `model`'s names, shapes and float dtypes."""
    if not file.is_file():
        raise ValueError(f"{file}: missing checkpoint file")
    try:
        tensors = load_file(file)
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{file}: corrupt safetensors file ({e})") from e
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{file}: missing tensor(s) {', '.join(missing[:5])}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise ValueError(f"{file}: unexpected tensor(s) {', '.join(unexpected[:5])}")
    for name, ref in expected.items():
        t = tensors[name]
        if t.shape != ref.shape:
            raise ValueError(
                f"{file}: tensor {name!r} has shape {list(t.shape)}, the config needs "
                f"{list(ref.shape)}"
            )
        if t.dtype != ref.dtype:
            raise ValueError(f"{file}: tensor {name!r} has dtype {t.dtype}, expected {ref.dtype}")
    # own (aligned) memory, detached from the memory-mapped file, which a later save may replace
    return {k: t.clone() for k, t in tensors.items()}


def load_checkpoint(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[HoverflyVLA, HoverflyVLAProcessor]:
    """(model in eval mode on `device`, processor) from a folder written by `save_checkpoint`.
    Raises ValueError naming the file and field / tensor on any missing or inconsistent part."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: no checkpoint directory")
    config = _load_config(path / CONFIG_NAME)
    try:
        processor = HoverflyVLAProcessor.from_dict(_read_json(path / PROCESSOR_NAME), config)
    except (ValueError, TypeError, KeyError) as e:
        msg = str(e)
        raise ValueError(
            msg if msg.startswith(str(path)) else f"{path / PROCESSOR_NAME}: {msg}"
        ) from e
    with torch.device("meta"):
        model = HoverflyVLA(config)
    tensors = _load_weights(path / WEIGHTS_NAME, model)
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.to(device).eval(), processor


def load_train_state(path: str | os.PathLike) -> dict[str, Any] | None:
    """The checkpoint's `train_state.pt` (None when absent), loaded with weights_only=True."""
    file = Path(path) / TRAIN_STATE_NAME
    if not file.exists():
        return None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{file}: unreadable train state ({e})") from e
    if not isinstance(state, dict):
        raise ValueError(f"{file}: expected a dict, got {type(state).__name__}")
    return state


_RUN_CHECKPOINT = re.compile(r"(step|iter)_\d+")
"""Checkpoint folder names of the run folders: SFT `step_<N>`, RL `iter_<N>`."""


def run_checkpoints(out: str | os.PathLike) -> list[Path]:
    """The checkpoint folders of a run folder, oldest first (`checkpoints/step_*` of an SFT run,
    `checkpoints/iter_*` of an RL run)."""
    folder = Path(out) / "checkpoints"
    return sorted(p for p in folder.glob("*_*") if _RUN_CHECKPOINT.fullmatch(p.name) and p.is_dir())


def latest_checkpoint(out: str | os.PathLike) -> Path | None:
    """The newest checkpoint of a run folder (None when there is none)."""
    found = run_checkpoints(out)
    return found[-1] if found else None


def prune_checkpoints(out: str | os.PathLike, keep: int) -> None:
    """Deletes all but the newest `keep` checkpoints of a run folder."""
    for old in run_checkpoints(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """`path` when it is a checkpoint folder, else the newest checkpoint of the run folder `path`.
    FileNotFoundError when there is none."""
    path = Path(path)
    if (path / CONFIG_NAME).is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"{path}: neither a VLA checkpoint nor a run folder with one")
    return found
