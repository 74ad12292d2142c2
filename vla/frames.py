"""Demonstration frames in memory for training (`vla.sft`, `vla.rl`, `vla.rft`): one or more
LeRobotDatasets of a scene decoded into one pool, and model batches gathered from it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vla.configuration_hoverfly_vla import HoverflyVLAConfig
from vla.dataset import DatasetError, LeRobotDataset, _image_hw, compute_action_chunks
from vla.processor_hoverfly_vla import HoverflyVLAProcessor


@dataclass
class Frames:
    """Every frame of a dataset in memory: images {camera: uint8 tensor [N, H, W, 3]} on the
    training device (batches are gathered and resized there), states [N, Ds], action chunks
    [N, H, A] (absolute, as stored), is_pad [N, H], task [N] (index into tasks)."""

    images: dict[str, torch.Tensor]
    states: np.ndarray
    chunks: np.ndarray
    is_pad: np.ndarray
    task: np.ndarray
    tasks: list[str]


def camera_key(cam: str) -> str:
    return f"observation.images.{cam}"


def fingerprint(ds: LeRobotDataset) -> dict[str, Any]:
    feats = {k: [ft["dtype"], ft["shape"]] for k, ft in sorted(ds.features.items())}
    return {
        "total_episodes": ds.num_episodes,
        "total_frames": len(ds),
        "fps": ds.fps,
        "features": feats,
    }


def load_frames(
    datasets: Sequence[LeRobotDataset], mcfg: HoverflyVLAConfig, device: torch.device
) -> Frames:
    """Decodes every episode of the datasets once, pooled (each video file by one ffmpeg process;
    images stay uint8, on `device`: batches are gathered and resized there, not on the host)."""
    for ds in datasets:
        if not ds.num_episodes:
            raise DatasetError(f"{ds.root}: total_episodes: the dataset has no episodes")
    total = sum(len(ds) for ds in datasets)
    features = datasets[0].features
    images = {
        c: np.empty((total, *_image_hw(features[camera_key(c)]), 3), np.uint8) for c in mcfg.cameras
    }
    states, chunks, pads, task_ids, tasks, row = [], [], [], [], {}, 0
    for ds in datasets:
        for cam in mcfg.cameras:
            images[cam][row : row + len(ds)] = ds.camera_frames(camera_key(cam))
        row += len(ds)
        for e in ds.episodes:
            ep = ds.episode(e.index, images=False)
            states.append(np.asarray(ep["observation.state"], np.float32).reshape(e.length, -1))
            actions = np.asarray(ep["action"], np.float32).reshape(e.length, -1)
            chunk, pad = compute_action_chunks(actions, mcfg.chunk_size)
            chunks.append(chunk)
            pads.append(pad)
            task_id = tasks.setdefault(ep["task"], len(tasks))
            task_ids.append(np.full(e.length, task_id, np.int64))
    return Frames(
        {c: torch.from_numpy(v).to(device) for c, v in images.items()},
        np.concatenate(states),
        np.concatenate(chunks),
        np.concatenate(pads),
        np.concatenate(task_ids),
        list(tasks),
    )


_PER_COLLECTION = (
    "episodes",
    "seed",
    "batch_size",
    "max_attempts",
    "keep_failures",
    "expert",
    "student",
    "takeover",
)
"""Collect settings that may differ between datasets trained on together (the scene may not)."""


def _scene(env_info: Any) -> Any:
    """The env settings of a dataset's "hoverfly" info, with the collect settings it predates at
    their defaults (`collect_config_from_info`)."""
    from vla.collect import collect_config_from_info

    if not isinstance(env_info, dict) or "collect" not in env_info:
        return env_info
    settings = dataclasses.asdict(collect_config_from_info(env_info)).items()
    collect = {k: v for k, v in settings if k not in _PER_COLLECTION}
    return {k: v for k, v in env_info.items() if k != "expert"} | {"collect": collect}


def check_poolable(datasets: Sequence[LeRobotDataset]) -> None:
    """DatasetError naming the dataset whose features, fps or scene (the env settings of
    meta/info.json's "hoverfly" section) differ from the first one's."""
    first = datasets[0]
    for ds in datasets[1:]:
        info = ds.root / "meta" / "info.json"
        for field, mine, theirs in (
            ("features", ds.features, first.features),
            ("fps", ds.fps, first.fps),
            ("hoverfly", _scene(ds.info.get("hoverfly")), _scene(first.info.get("hoverfly"))),
        ):
            if mine != theirs:
                raise DatasetError(
                    f"{info}: {field}: differs from {first.root}'s; datasets trained on together "
                    "need the same features, fps and scene"
                )


def gather_batch(
    frames: Frames, processor: HoverflyVLAProcessor, idx: np.ndarray, device: torch.device
) -> dict[str, torch.Tensor]:
    rows = torch.as_tensor(idx, device=device)
    images = {c: frames.images[c][rows] for c in processor.config.cameras}
    texts = [frames.tasks[i] for i in frames.task[idx]]
    batch = processor(images, frames.states[idx], texts, frames.chunks[idx])
    batch["action_is_pad"] = torch.from_numpy(frames.is_pad[idx])
    return {k: v.to(device) for k, v in batch.items()}


__all__ = ["Frames", "gather_batch", "camera_key", "check_poolable", "fingerprint", "load_frames"]
