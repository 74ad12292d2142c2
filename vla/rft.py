"""Rejection-sampling fine-tuning (`RLConfig.algo = "rft"`; ReST-EM, Singh et al. 2023; RAFT,
Dong et al. 2023): EM on the binary outcome. The E-step keeps the successful episodes of the
iteration's rollout, the M-step maximizes their likelihood with the flow-matching loss.

Each kept episode becomes demonstration frames, one per executed chunk, whose targets are the
actions executed from that frame on (cut as `compute_action_chunks` cuts a recorded episode), so
the policy imitates its own on-policy successes, recoveries included. The replay holds every
iteration's successes, one part per iteration in `<out>/replay/iter_<NNNNNN>.npz` (written
atomically; a resumed run reloads the parts up to its checkpoint). In groups from identical
states, dynamic sampling keeps only the successes of states the policy does not always solve.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from algos.run_folder import atomic_write
from vla.dataset import compute_action_chunks
from vla.frames import Frames, gather_batch

if TYPE_CHECKING:
    from vla.rl import _Rollout, _Run

__all__ = ["Replay", "load_replay", "success_frames", "update"]

_FIELDS = ("images", "states", "chunks", "is_pad", "texts")


def success_frames(
    ro: _Rollout, chunk_size: int, k: int, keep: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The successful episodes of a rollout (those of them in `keep` [B], bool, if given) as
    demonstration frames, one per executed chunk:
    images uint8 [N, h, W · cams, 3], states [N, Ds] (raw), chunks [N, H, A] (the absolute actions
    executed from that frame on, as `compute_action_chunks` cuts a demonstration), is_pad [N, H],
    texts [N]."""
    parts: dict[str, list] = {n: [] for n in _FIELDS}
    for b in np.flatnonzero(ro.success if keep is None else ro.success & keep):
        n = int(ro.lengths[b])
        chunks, pad = compute_action_chunks(ro.actions[b, :n], chunk_size)
        starts = np.arange(0, n, k)
        parts["images"].append(ro.images[b, : len(starts)])
        parts["states"].append(ro.proprio[b, : len(starts)])
        parts["chunks"].append(chunks[starts])
        parts["is_pad"].append(pad[starts])
        parts["texts"].append(np.array([ro.texts[b]] * len(starts)))
    if not parts["images"]:
        h, w = ro.images.shape[2:4]
        a = ro.actions.shape[-1]
        return {
            "images": np.zeros((0, h, w, 3), np.uint8),
            "states": np.zeros((0, ro.proprio.shape[-1]), np.float32),
            "chunks": np.zeros((0, chunk_size, a), np.float32),
            "is_pad": np.zeros((0, chunk_size), bool),
            "texts": np.zeros(0, "<U1"),
        }
    return {n: np.concatenate(v) for n, v in parts.items()}


class Replay:
    """Every iteration's successful frames in one growing buffer per field (the capacity doubles,
    so adding a part copies that part, not the whole replay), seen as one `frames.Frames`: the
    cameras split from the side-by-side images, on the training device."""

    def __init__(self, cameras, device: torch.device):
        self.cameras, self.device = tuple(cameras), device
        self.n = 0
        self._images: dict[str, torch.Tensor] = {}
        self._arrays: dict[str, np.ndarray] = {}  # states, chunks, is_pad, task
        self._tasks: dict[str, int] = {}

    def __len__(self) -> int:
        return self.n

    def append(self, part: dict[str, np.ndarray]) -> None:
        """Adds a part (`success_frames`' fields) after the frames already held."""
        k = len(part["states"])
        w = part["images"].shape[2] // len(self.cameras)
        task = np.array([self._tasks.setdefault(str(t), len(self._tasks)) for t in part["texts"]])
        new = {"states": part["states"], "chunks": part["chunks"], "is_pad": part["is_pad"]}
        new["task"] = task.astype(np.int64).reshape(k)
        cams = {c: part["images"][:, :, i * w : (i + 1) * w] for i, c in enumerate(self.cameras)}
        if not self._arrays or self.n + k > len(self._arrays["states"]):
            self._grow(max(2 * self.n, self.n + k, 1), new, cams)
        for name, v in new.items():
            self._arrays[name][self.n : self.n + k] = v
        for c, v in cams.items():
            self._images[c][self.n : self.n + k] = torch.from_numpy(np.ascontiguousarray(v))
        self.n += k

    def _grow(self, capacity: int, new: dict[str, np.ndarray], cams: dict[str, np.ndarray]):
        for name, v in new.items():
            grown = np.empty((capacity, *v.shape[1:]), v.dtype)
            if name in self._arrays:
                grown[: self.n] = self._arrays[name][: self.n]
            self._arrays[name] = grown
        for c, v in cams.items():
            grown = torch.empty((capacity, *v.shape[1:]), dtype=torch.uint8, device=self.device)
            if c in self._images:
                grown[: self.n] = self._images[c][: self.n]
            self._images[c] = grown

    def frames(self) -> Frames:
        """The frames held so far (views of the buffers)."""
        a, n = self._arrays, self.n
        return Frames(
            {c: v[:n] for c, v in self._images.items()},
            a["states"][:n],
            a["chunks"][:n],
            a["is_pad"][:n],
            a["task"][:n],
            list(self._tasks),
        )


def _path(out: Path, iteration: int) -> Path:
    return out / "replay" / f"iter_{iteration:06d}.npz"


def _save(path: Path, part: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, **part)
    atomic_write(path, buf.getvalue())


def load_replay(out: Path, iterations: int, replay: Replay) -> None:
    """Adds the replay parts of iterations 1 … `iterations` of the run folder `out` to `replay`."""
    for i in range(1, iterations + 1):
        path = _path(out, i)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: replay part missing (the run cannot resume)")
        with np.load(path, allow_pickle=False) as z:
            replay.append({n: z[n] for n in _FIELDS})


def update(run: _Run, ro: _Rollout, group: int, seed: int) -> tuple[dict[str, float], float]:
    """One iteration's E- and M-step: keeps the rollout's successes (in groups of `group`, with
    dynamic sampling those of states not always solved) as the replay's next part, written to
    the run folder, then `imitate`. Returns the update metrics and the share of mixed groups
    (NaN without groups)."""
    cfg, c = run.cfg, run.model.config
    outcomes = ro.success.reshape(-1, group)
    solved = outcomes.all(1)
    keep = ~np.repeat(solved, group) if group > 1 and cfg.dynamic_sampling else None
    part = success_frames(ro, c.chunk_size, c.n_action_steps, keep)
    _save(_path(run.out, run.iteration + 1), part)
    run.replay.append(part)
    metrics = imitate(run, len(part["states"]), seed)
    mixed = float((outcomes.any(1) & ~solved).mean()) if keep is not None else math.nan
    return metrics, mixed


def imitate(run: _Run, new: int, seed: int) -> dict[str, float]:
    """The M-step: ⌈epochs · new / minibatch_size⌉ flow-matching steps on minibatches drawn
    uniformly from the replay of every iteration's successful frames (`new` of them from this
    one), each + sft_coef × the RL-Co anchor's loss."""
    cfg, model, dev = run.cfg, run.model, run.model.patch_pos.device
    model.train()
    rng = np.random.default_rng(seed)
    gen = torch.Generator(dev).manual_seed(seed)
    steps = math.ceil(cfg.epochs * new / cfg.minibatch_size)
    frames = run.replay.frames() if steps else None
    sums = {"policy_loss": 0.0, "sft_loss": 0.0}
    for _ in range(steps):
        idx = rng.integers(0, len(frames.states), cfg.minibatch_size)
        loss = model.flow_matching_loss(
            gather_batch(frames, run.processor, idx, dev), generator=gen
        )
        sft_loss = run.anchor_loss(rng, gen)
        run.optimizer_step(loss + cfg.sft_coef * sft_loss)
        sums["policy_loss"] += float(loss.detach())
        sums["sft_loss"] += float(sft_loss.detach())
    return {k: v / max(steps, 1) for k, v in sums.items()} | {
        "value_loss": 0.0,
        "updates": steps,
        "approx_kl": math.nan,
        "clip_frac": math.nan,
    }
