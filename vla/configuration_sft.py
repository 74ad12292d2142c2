"""`SFTConfig`: behaviour cloning settings of `vla.sft` (torch-free, so the CLI parses it
without importing torch)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from vla.configuration_hoverfly_vla import PRESETS, HoverflyVLAConfig


@dataclass(frozen=True)
class SFTConfig:
    """Behaviour cloning of `HoverflyVLA` on a LeRobotDataset."""

    data: tuple[str, ...] = ()
    """Dataset folders (LeRobotDataset layout, e.g. written by `vla.collect`), trained on as one:
    their frames pooled, with the same features and env settings."""
    out: str = "runs/sft"
    """Run folder: metrics, checkpoints; an existing run there is resumed."""
    preset: str = "small"
    """Model preset: test / small / base (`vla.configuration_hoverfly_vla.PRESETS`)."""
    model_overrides: dict[str, int | float | str] = field(default_factory=dict)
    """HoverflyVLAConfig fields replacing the preset's, as NAME VALUE pairs (e.g.
    `--model-overrides vision_encoder cnn image_size 64`; proprio_dim / action_dim come from the
    dataset)."""
    init: str = ""
    """Fine-tune: start from this VLA checkpoint (or an SFT / RL run folder: its newest) instead
    of random weights, keeping its model config and norm stats (`preset` and `model_overrides`
    are then unused; `norm_mode` and `action_representation` must be the checkpoint's)."""
    steps: int = 10_000
    """Optimizer steps in all (may be raised when resuming)."""
    batch_size: int = 32
    """Frames (each with its action chunk) per step."""
    lr: float = 3e-4
    """Peak AdamW learning rate."""
    warmup_steps: int = 500
    """Linear warm-up from 0 to `lr`, steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay from `lr` to `lr · min_lr_ratio` at `steps`."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (matrices only; biases, norms and 1-D parameters skip it)."""
    beta1: float = 0.9
    """AdamW β1."""
    beta2: float = 0.95
    """AdamW β2."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    ema_decay: float = 0.0
    """Exponential moving average of the weights, updated after every optimizer step
    (p̄ ← d · p̄ + (1 − d) · p, as openpi trains π0): evaluations and the checkpoints' model are
    the average, the trained weights go to train_state.pt. 0: off."""
    seed: int = 0
    """Seeds the initialization, the batch order and the flow noise."""
    action_representation: Literal["absolute", "delta"] = "absolute"
    """Targets: the stored actions ("absolute") or action − state[:A] ("delta")."""
    norm_mode: Literal["mean_std", "min_max"] = "mean_std"
    """Normalization of state and action targets."""
    checkpoint_every: int = 1000
    """Save a checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept (older ones are deleted)."""
    log_every: int = 10
    """Write a metrics.csv row every this many steps."""
    eval_every: int = 0
    """Closed-loop evaluation every this many steps (and at the end); 0: never."""
    eval_episodes: int = 16
    """Episodes per closed-loop evaluation."""
    device: str = "cpu"
    """torch device."""

    def validate(self) -> None:
        """ValueError naming the first bad field."""
        if isinstance(self.data, str) or not self.data or not all(self.data):
            raise ValueError(f"SFTConfig.data: dataset folders are needed, got {self.data!r}")
        if not self.out:
            raise ValueError("SFTConfig.out: a run folder is required")
        if self.preset not in PRESETS:
            raise ValueError(f"SFTConfig.preset: {self.preset!r} not in {sorted(PRESETS)}")
        bad = sorted(
            set(self.model_overrides) - {f.name for f in dataclasses.fields(HoverflyVLAConfig)}
        )
        if bad:
            raise ValueError(f"SFTConfig.model_overrides: unknown HoverflyVLAConfig field(s) {bad}")
        if self.init and self.model_overrides:
            raise ValueError(
                "SFTConfig.model_overrides: the model of `init` is fine-tuned as it is"
            )
        for name in ("steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every"):
            _positive_int(name, getattr(self, name), 1)
        for name in ("warmup_steps", "eval_every", "eval_episodes", "seed"):
            _positive_int(name, getattr(self, name), 0)
        if self.eval_every and not self.eval_episodes:
            raise ValueError("SFTConfig.eval_episodes: must be ≥ 1 when eval_every > 0")
        for name, ok in (
            ("lr", self.lr > 0),
            ("max_grad_norm", self.max_grad_norm > 0),
            ("weight_decay", self.weight_decay >= 0),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1),
            ("beta1", 0 <= self.beta1 < 1),
            ("beta2", 0 <= self.beta2 < 1),
            ("ema_decay", 0 <= self.ema_decay < 1),
        ):
            if not ok or not math.isfinite(getattr(self, name)):
                raise ValueError(f"SFTConfig.{name}: {getattr(self, name)!r} out of range")
        if self.action_representation not in ("absolute", "delta"):
            raise ValueError(
                f"SFTConfig.action_representation: {self.action_representation!r} is not "
                "'absolute' or 'delta'"
            )
        if self.norm_mode not in ("mean_std", "min_max"):
            raise ValueError(f"SFTConfig.norm_mode: {self.norm_mode!r} is not mean_std / min_max")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "data": list(self.data),
            "model_overrides": dict(self.model_overrides),
        }


def _positive_int(name: str, v: Any, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"SFTConfig.{name}: must be an int ≥ {lo}, got {v!r}")
