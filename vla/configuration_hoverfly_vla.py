"""Configuration of the compact built-in VLA (`HoverflyVLA`): a scaled-down member of the
π0 / SmolVLA family (Black et al. 2024, "π0: A Vision-Language-Action Flow Model for General Robot
Control"; Shukor et al. 2025, "SmolVLA").

One frozen dataclass, validated on construction (a bad value raises ValueError naming the field),
with a strict JSON round trip (`to_dict` / `from_dict`: unknown or missing keys are errors, so a
checkpoint's `config.json` alone rebuilds its network). Named presets: `TEST` (~1M parameters, for
unit tests), `SMALL` (~13M, CPU-trainable), `BASE` (~100M, one GPU).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["BASE", "PRESETS", "SMALL", "TEST", "HoverflyVLAConfig"]

_INT_FIELDS = (
    "image_size",
    "patch_size",
    "d_model",
    "n_heads",
    "vision_layers",
    "prefix_layers",
    "expert_layers",
    "expert_width",
    "mlp_ratio",
    "vocab_size",
    "max_tokens",
    "proprio_dim",
    "action_dim",
    "chunk_size",
    "n_action_steps",
    "num_flow_steps",
    "keypoints",
)
_ENCODERS = ("vit", "cnn")
_ADDED_FIELDS = {"vision_encoder": "vit", "keypoints": 16}
"""Fields added after checkpoints were first written: a config.json without them gets these
values (what the network was before the field existed)."""
_FLOAT_FIELDS = ("time_beta_alpha", "rl_noise_std_init", "rl_noise_std_min", "rl_noise_std_max")


@dataclass(frozen=True)
class HoverflyVLAConfig:
    """Architecture and sampling settings of `HoverflyVLA`.

    Prefix tokens: `len(cameras) · image_tokens` image tokens, `max_tokens` text
    tokens and one proprio token, width `d_model`. The action expert runs over `chunk_size` action
    tokens of width `expert_width`; its attention uses the prefix's heads (`n_heads` ×
    `d_model / n_heads`) so expert layer j reads the keys/values of prefix layer
    `(j + 1) · prefix_layers / expert_layers - 1` (π0's shared attention, SmolVLA's layer skip).
    """

    image_size: int = 64
    """Side of the square model input image, px (camera frames are resized to it)."""
    cameras: tuple[str, ...] = ("front", "wrist")
    """Camera names, in the order their images enter the model."""
    vision_encoder: str = "vit"
    """Image encoder: "vit" (patchify + transformer, `(image_size / patch_size)²` tokens per
    camera) or "cnn" (a conv stem to a stride-4 feature map, then `keypoints` spatial-softmax
    keypoints per camera, each a token of its expected (x, y) and attended features, then the
    transformer). Spatial softmax localizes small objects (a few pixels) that a linear patch
    embedding blurs (Levine et al. 2016, "End-to-End Training of Deep Visuomotor Policies")."""
    patch_size: int = 8
    """ViT patch side, px; must divide `image_size` (the "vit" encoder)."""
    keypoints: int = 16
    """Spatial-softmax keypoints (image tokens) per camera (the "cnn" encoder)."""
    d_model: int = 256
    """Width of the vision encoder and the prefix transformer."""
    n_heads: int = 4
    """Attention heads of the prefix and of the expert (head dim = d_model / n_heads)."""
    vision_layers: int = 4
    """Transformer layers of the per-camera image encoder (weights shared across cameras)."""
    prefix_layers: int = 6
    """Layers of the prefix transformer over [image, text, proprio] tokens."""
    expert_layers: int = 6
    """Layers of the flow-matching action expert; must divide `prefix_layers`."""
    expert_width: int = 256
    """Hidden width of the action expert."""
    mlp_ratio: int = 4
    """MLP hidden width / model width, in every transformer block."""
    vocab_size: int = 512
    """Text embedding rows; at least the built-in tokenizer's vocabulary (processor checks)."""
    max_tokens: int = 16
    """Instruction tokens after padding / truncation."""
    proprio_dim: int = 16
    """Proprioceptive state size (the env's `observation_size["state"]` or a subset)."""
    action_dim: int = 8
    """Action size per step (the env's `action_size`)."""
    chunk_size: int = 16
    """Action chunk horizon H predicted per inference."""
    n_action_steps: int = 8
    """Actions K ≤ H executed from each chunk before re-planning."""
    num_flow_steps: int = 10
    """Euler steps integrating the flow from noise (t = 1) to actions (t = 0)."""
    time_beta_alpha: float = 1.5
    """Training times t = 0.001 + 0.999 · Beta(alpha, 1) (π0 uses 1.5; 1.0 is uniform)."""
    rl_noise_std_init: float = 0.1
    """Initial std of the learned per-dimension flow-noise of the RL sampler (normalized units)."""
    rl_noise_std_min: float = 0.01
    """Lower clamp of the flow-noise std."""
    rl_noise_std_max: float = 0.5
    """Upper clamp of the flow-noise std."""

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"HoverflyVLAConfig.{name} must be a positive int, got {value!r}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"HoverflyVLAConfig.{name} must be a float, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"HoverflyVLAConfig.{name} must be finite and > 0, got {value!r}")
        if self.vision_encoder not in _ENCODERS:
            raise ValueError(
                f"HoverflyVLAConfig.vision_encoder must be one of {_ENCODERS}, got "
                f"{self.vision_encoder!r}"
            )
        if self.vision_encoder == "cnn" and self.image_size % 4:
            raise ValueError(
                f"HoverflyVLAConfig.image_size ({self.image_size}) must be a multiple of 4 for "
                f"the cnn encoder (stride 4)"
            )
        cams = self.cameras
        if not isinstance(cams, tuple) or not cams:
            raise ValueError(f"HoverflyVLAConfig.cameras must be a non-empty tuple, got {cams!r}")
        if any(not isinstance(c, str) or not c for c in cams) or len(set(cams)) != len(cams):
            raise ValueError(
                f"HoverflyVLAConfig.cameras must be distinct non-empty names, got {cams!r}"
            )
        if self.vision_encoder == "vit" and self.image_size % self.patch_size:
            raise ValueError(
                f"HoverflyVLAConfig.patch_size ({self.patch_size}) must divide image_size "
                f"({self.image_size})"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"HoverflyVLAConfig.n_heads ({self.n_heads}) must divide d_model ({self.d_model})"
            )
        if self.prefix_layers % self.expert_layers:
            raise ValueError(
                f"HoverflyVLAConfig.expert_layers ({self.expert_layers}) must divide prefix_layers "
                f"({self.prefix_layers})"
            )
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"HoverflyVLAConfig.n_action_steps ({self.n_action_steps}) must be <= chunk_size "
                f"({self.chunk_size})"
            )
        if self.rl_noise_std_min > self.rl_noise_std_max:
            raise ValueError(
                f"HoverflyVLAConfig.rl_noise_std_min ({self.rl_noise_std_min}) must be <= "
                f"rl_noise_std_max ({self.rl_noise_std_max})"
            )
        if not self.rl_noise_std_min <= self.rl_noise_std_init <= self.rl_noise_std_max:
            raise ValueError(
                f"HoverflyVLAConfig.rl_noise_std_init ({self.rl_noise_std_init}) must lie in "
                f"[rl_noise_std_min, rl_noise_std_max]"
            )

    # -- derived sizes -----------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def image_tokens(self) -> int:
        """Image tokens per camera: ViT patches or CNN keypoints."""
        if self.vision_encoder == "cnn":
            return self.keypoints
        return (self.image_size // self.patch_size) ** 2

    @property
    def prefix_len(self) -> int:
        """Prefix tokens P = cameras · image_tokens + max_tokens + 1 (proprio)."""
        return len(self.cameras) * self.image_tokens + self.max_tokens + 1

    @property
    def expert_kv_layers(self) -> tuple[int, ...]:
        """Index of the prefix layer whose keys/values expert layer j attends to."""
        stride = self.prefix_layers // self.expert_layers
        return tuple((j + 1) * stride - 1 for j in range(self.expert_layers))

    # -- JSON --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["cameras"] = list(self.cameras)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HoverflyVLAConfig:
        """Inverse of `to_dict`. Raises ValueError on unknown or missing keys (naming them) and on
        invalid values; only the later-added fields (`_ADDED_FIELDS`) may be absent."""
        if not isinstance(data, dict):
            raise ValueError(
                f"HoverflyVLAConfig.from_dict expects a dict, got {type(data).__name__}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown HoverflyVLAConfig key(s): {', '.join(unknown)}")
        data = {**_ADDED_FIELDS, **data}
        missing = sorted(names - set(data))
        if missing:
            raise ValueError(f"missing HoverflyVLAConfig key(s): {', '.join(missing)}")
        kwargs = dict(data)
        if isinstance(kwargs["cameras"], list):
            kwargs["cameras"] = tuple(kwargs["cameras"])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> HoverflyVLAConfig:
        """A copy with `changes` applied (validated)."""
        return dataclasses.replace(self, **changes)


TEST = HoverflyVLAConfig(
    image_size=32,
    patch_size=8,
    d_model=128,
    n_heads=4,
    vision_layers=2,
    prefix_layers=2,
    expert_layers=2,
    expert_width=64,
    max_tokens=12,
    proprio_dim=8,
    action_dim=4,
    chunk_size=8,
    n_action_steps=4,
)
"""~1M parameters: unit tests and smoke runs."""

SMALL = HoverflyVLAConfig()
"""~13M parameters: 64 px, CPU-trainable on small tasks."""

BASE = HoverflyVLAConfig(
    image_size=96,
    patch_size=12,
    d_model=576,
    n_heads=9,
    vision_layers=6,
    prefix_layers=12,
    expert_layers=12,
    expert_width=384,
    max_tokens=24,
    chunk_size=32,
    n_action_steps=16,
)
"""~100M parameters: 96 px, one GPU."""

PRESETS: dict[str, HoverflyVLAConfig] = {"test": TEST, "small": SMALL, "base": BASE}
"""Named presets."""
