"""Pre- and post-processing of the compact VLA: the built-in instruction tokenizer, image
preprocessing, and normalization statistics of state and actions (lerobot's processor role).

Tokenizer: deterministic and offline. Text is lowercased and split into pieces (runs of ASCII
letters and digits, or single other non-space characters); a piece in the built-in manipulation
vocabulary is one token, any other piece falls back to its UTF-8 bytes (one token per byte).
Ids: 0 = padding, 1 ... 256 = bytes 0x00 ... 0xFF, 257 ... = words. Sequences are truncated /
padded to `max_tokens` with a boolean attention mask.

Normalization: `NormStats` holds per-dimension mean / std / min / max of the state and of the
actions in the representation the model is trained on ("absolute", or "delta" = action minus the
first `action_dim` entries of the state at the chunk start), and the mode used ("mean_std":
(x - mean) / (std + eps); "min_max": to [-1, 1]).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vla.configuration_hoverfly_vla import HoverflyVLAConfig

__all__ = [
    "WORDS",
    "FeatureStats",
    "HoverflyTokenizer",
    "HoverflyVLAProcessor",
    "NormStats",
    "compute_norm_stats",
    "preprocess_images",
]

WORDS: tuple[str, ...] = tuple(
    """
    a an the this that these those it its them they one two three first second last all other
    same each both either any some of to in into inside on onto off from at by with without up
    down over under above below behind beside near next between across through around along out
    away toward towards back front left right top bottom middle center corner edge side far close
    and then or but not while until after before again also only is are be now
    pick place put push pull lift lower raise move grasp grab hold release drop open close turn
    rotate twist slide stack unstack insert remove press reach pour wipe fold unfold hang align
    flip point go take bring set get give carry throw catch sort arrange clean fill empty shake
    stop wait return keep make use find touch hover fly land
    red green blue yellow black white orange purple pink brown gray grey small large big little
    tall short long wide round square light dark heavy empty full
    cube cubes block blocks box boxes ball balls bowl plate cup mug bottle can jar drawer door lid
    table shelf basket tray bin target goal object objects item items gripper arm hand robot
    position location spot area marker pen sponge towel cloth button handle knob switch stove
    sink microwave cabinet rack peg hole ring tower stick cylinder lego toy fruit apple banana
    slowly quickly carefully gently
    """.split()
)
"""Built-in word vocabulary (manipulation instructions); anything else falls back to bytes."""

PAD_ID = 0
_BYTE_OFFSET = 1
_WORD_OFFSET = _BYTE_OFFSET + 256
_PIECE = re.compile(r"[a-z0-9]+|[^a-z0-9\s]")
_TOKENIZER_TYPE = "hoverfly-word-byte-v1"


class HoverflyTokenizer:
    """Word-level tokenizer over `words` with UTF-8 byte fallback (see module docstring).

    `__call__(texts) -> (ids int64 [B, max_tokens], mask bool [B, max_tokens])`.
    """

    def __init__(self, max_tokens: int, words: Sequence[str] = WORDS):
        if max_tokens <= 0:
            raise ValueError(f"tokenizer max_tokens must be > 0, got {max_tokens}")
        words = tuple(dict.fromkeys(words))  # distinct, order kept
        bad = [w for w in words if _PIECE.fullmatch(w) is None or not w.isascii()]
        if bad:
            raise ValueError(f"tokenizer words must be single lowercase pieces, got {bad[:5]}")
        self.max_tokens = max_tokens
        self.words = words
        self._word_id = {w: _WORD_OFFSET + i for i, w in enumerate(words)}

    @property
    def vocab_size(self) -> int:
        """Number of token ids (padding + 256 bytes + words)."""
        return _WORD_OFFSET + len(self.words)

    @staticmethod
    def normalize(text: str) -> str:
        """The canonical form `decode(encode(text))` returns: lowercased pieces joined by spaces."""
        return " ".join(_PIECE.findall(text.lower()))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, untruncated."""
        ids: list[int] = []
        prev_bytes = False
        for piece in _PIECE.findall(text.lower()):
            word = self._word_id.get(piece)
            if word is not None:
                ids.append(word)
                prev_bytes = False
                continue
            if prev_bytes:  # keep two byte-coded pieces apart
                ids.append(_BYTE_OFFSET + ord(" "))
            ids.extend(_BYTE_OFFSET + b for b in piece.encode("utf-8"))
            prev_bytes = True
        return ids

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Text of token ids (padding skipped), in `normalize` form."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        parts: list[bytes] = []
        for i in ids:
            if i == PAD_ID:
                continue
            if _BYTE_OFFSET <= i < _WORD_OFFSET:
                parts.append(bytes([i - _BYTE_OFFSET]))
            elif _WORD_OFFSET <= i < self.vocab_size:
                parts.append(b" " + self.words[i - _WORD_OFFSET].encode() + b" ")
            else:
                raise ValueError(f"token id {i} outside the vocabulary [0, {self.vocab_size})")
        return " ".join(b"".join(parts).decode("utf-8", errors="replace").split())

    def __call__(self, texts: str | Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """texts (one string or B) -> ids int64 [B, max_tokens], mask bool [B, max_tokens];
        longer instructions are truncated, shorter ones right-padded with id 0."""
        if isinstance(texts, str):
            texts = [texts]
        ids = torch.zeros(len(texts), self.max_tokens, dtype=torch.int64)
        mask = torch.zeros(len(texts), self.max_tokens, dtype=torch.bool)
        for row, text in enumerate(texts):
            tokens = self.encode(text)[: self.max_tokens]
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            mask[row, : len(tokens)] = True
        return ids, mask

    def to_dict(self) -> dict[str, Any]:
        return {"type": _TOKENIZER_TYPE, "max_tokens": self.max_tokens, "words": list(self.words)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HoverflyTokenizer:
        _check_keys("tokenizer", data, {"type", "max_tokens", "words"})
        if data["type"] != _TOKENIZER_TYPE:
            raise ValueError(f"tokenizer.type is {data['type']!r}, expected {_TOKENIZER_TYPE!r}")
        return cls(int(data["max_tokens"]), tuple(data["words"]))


def preprocess_images(images: np.ndarray | torch.Tensor, size: int) -> torch.Tensor:
    """uint8 images [..., H, W, 3] -> float32 [..., 3, size, size] in [-1, 1] (bilinear,
    antialiased resize when H or W differs from `size`; the aspect ratio is not kept)."""
    x = torch.as_tensor(images)
    if x.dtype != torch.uint8:
        raise ValueError(f"images must be uint8 [..., H, W, 3], got dtype {x.dtype}")
    if x.dim() < 3 or x.shape[-1] != 3:
        raise ValueError(f"images must be uint8 [..., H, W, 3], got shape {list(x.shape)}")
    lead, (h, w) = x.shape[:-3], x.shape[-3:-1]
    x = x.reshape(-1, h, w, 3).permute(0, 3, 1, 2).to(torch.float32)
    if (h, w) != (size, size):
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
    x = (x / 127.5 - 1.0).clamp(-1.0, 1.0)
    return x.reshape(*lead, 3, size, size)


def _check_keys(what: str, data: Mapping[str, Any], names: set[str]) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a JSON object, got {type(data).__name__}")
    unknown, missing = sorted(set(data) - names), sorted(names - set(data))
    if unknown:
        raise ValueError(f"unknown {what} key(s): {', '.join(unknown)}")
    if missing:
        raise ValueError(f"missing {what} key(s): {', '.join(missing)}")


@dataclass(frozen=True)
class FeatureStats:
    """Per-dimension statistics of one feature, each a tuple of D floats."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    min: tuple[float, ...]
    max: tuple[float, ...]

    def __post_init__(self) -> None:
        dims = {len(getattr(self, f.name)) for f in dataclasses.fields(self)}
        if len(dims) != 1 or 0 in dims:
            raise ValueError(f"FeatureStats fields need one common non-zero length, got {dims}")

    @property
    def dim(self) -> int:
        return len(self.mean)

    @classmethod
    def compute(cls, x: np.ndarray | torch.Tensor) -> FeatureStats:
        """Statistics over all leading axes of x [..., D] (float64 accumulation)."""
        x = torch.as_tensor(x).to(torch.float64).reshape(-1, torch.as_tensor(x).shape[-1])
        if x.shape[0] == 0:
            raise ValueError("cannot compute statistics of an empty array")
        std = x.std(0, unbiased=False)

        def tup(t: torch.Tensor) -> tuple[float, ...]:
            return tuple(float(v) for v in t)

        return cls(tup(x.mean(0)), tup(std), tup(x.min(0).values), tup(x.max(0).values))

    def to_dict(self) -> dict[str, list[float]]:
        return {f.name: list(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "stats") -> FeatureStats:
        _check_keys(what, data, {f.name for f in dataclasses.fields(cls)})
        return cls(**{k: tuple(float(v) for v in data[k]) for k in data})


_MODES = ("mean_std", "min_max")
_REPRESENTATIONS = ("absolute", "delta")
_EPS = 1e-6


@dataclass(frozen=True)
class NormStats:
    """Normalization of "state" [..., proprio_dim] and "action" [..., action_dim].

    mode: "mean_std" ((x - mean) / (std + eps)) or "min_max" (2 (x - min) / (max - min + eps) - 1).
    action_representation: what the action statistics (and the model's targets) describe:
    "absolute" actions or "delta" = action - state[:action_dim] at the chunk start.
    """

    state: FeatureStats
    action: FeatureStats
    mode: str = "mean_std"
    action_representation: str = "absolute"

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"NormStats.mode must be one of {_MODES}, got {self.mode!r}")
        if self.action_representation not in _REPRESENTATIONS:
            raise ValueError(
                f"NormStats.action_representation must be one of {_REPRESENTATIONS}, got "
                f"{self.action_representation!r}"
            )
        if self.action_representation == "delta" and self.state.dim < self.action.dim:
            raise ValueError(
                f"delta actions need state dim ({self.state.dim}) >= action dim ({self.action.dim})"
            )

    @classmethod
    def identity(cls, proprio_dim: int, action_dim: int) -> NormStats:
        """Stats that leave absolute state and actions unchanged (mean 0, std 1)."""

        def unit(d: int) -> FeatureStats:
            return FeatureStats((0.0,) * d, (1.0 - _EPS,) * d, (-1.0,) * d, (1.0,) * d)

        return cls(unit(proprio_dim), unit(action_dim))

    def _affine(self, key: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in ("state", "action"):
            raise ValueError(f"NormStats key must be 'state' or 'action', got {key!r}")
        stats: FeatureStats = getattr(self, key)
        if x.dim() == 0 or x.shape[-1] != stats.dim:
            raise ValueError(
                f"{key}: last dim of shape {list(x.shape)} does not match the stats dim {stats.dim}"
            )

        def t(v: tuple[float, ...]) -> torch.Tensor:
            return torch.tensor(v, dtype=torch.float64).to(x.device)

        if self.mode == "mean_std":  # x_n = (x - mean) / (std + eps)
            offset, scale = t(stats.mean), t(stats.std) + _EPS
        else:  # x_n = 2 (x - min) / (max - min + eps) - 1 = (x - center) / half_range
            lo, hi = t(stats.min), t(stats.max)
            offset, scale = (lo + hi) / 2, (hi - lo + _EPS) / 2
        return offset.to(x.dtype), scale.to(x.dtype)

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """Normalized x [..., D] of feature `key` ("state" or "action")."""
        x = torch.as_tensor(x, dtype=torch.float32) if not torch.is_tensor(x) else x
        offset, scale = self._affine(key, x)
        return (x - offset) / scale

    def unnormalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """Inverse of `normalize`."""
        x = torch.as_tensor(x, dtype=torch.float32) if not torch.is_tensor(x) else x
        offset, scale = self._affine(key, x)
        return x * scale + offset

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "action_representation": self.action_representation,
            "state": self.state.to_dict(),
            "action": self.action.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NormStats:
        _check_keys("norm_stats", data, {"mode", "action_representation", "state", "action"})
        return cls(
            FeatureStats.from_dict(data["state"], "norm_stats.state"),
            FeatureStats.from_dict(data["action"], "norm_stats.action"),
            data["mode"],
            data["action_representation"],
        )


def _delta(actions: torch.Tensor, state: torch.Tensor, sign: float) -> torch.Tensor:
    """actions [N, ..., A] ± state[:, :A] broadcast over the middle axes."""
    a = actions.shape[-1]
    if state.shape[0] != actions.shape[0] or state.shape[-1] < a:
        raise ValueError(
            f"delta actions: state shape {list(state.shape)} does not match actions "
            f"{list(actions.shape)} (needs [N, >= {a}])"
        )
    s = state[..., :a].reshape(state.shape[0], *([1] * (actions.dim() - 2)), a)
    return actions + sign * s.to(actions.dtype)


def compute_norm_stats(
    states: np.ndarray | torch.Tensor,
    actions: np.ndarray | torch.Tensor,
    mode: str = "mean_std",
    action_representation: str = "absolute",
) -> NormStats:
    """Stats from data: states [N, Ds] and absolute actions [N, A] or chunks [N, H, A] taken from
    state N. With "delta" the action statistics are computed over action - state[:A]."""
    states, actions = torch.as_tensor(states), torch.as_tensor(actions)
    if action_representation == "delta":
        actions = _delta(actions.to(torch.float64), states.to(torch.float64), -1.0)
    return NormStats(
        FeatureStats.compute(states), FeatureStats.compute(actions), mode, action_representation
    )


class HoverflyVLAProcessor:
    """Turns raw observations into model inputs and model chunks back into robot actions.

    Holds the tokenizer, image size, camera order and `NormStats` (identity when None).
    """

    def __init__(
        self,
        config: HoverflyVLAConfig,
        stats: NormStats | None = None,
        tokenizer: HoverflyTokenizer | None = None,
    ):
        self.config = config
        self.tokenizer = tokenizer or HoverflyTokenizer(config.max_tokens)
        self.stats = stats or NormStats.identity(config.proprio_dim, config.action_dim)
        if self.tokenizer.max_tokens != config.max_tokens:
            raise ValueError(
                f"tokenizer.max_tokens ({self.tokenizer.max_tokens}) != config.max_tokens "
                f"({config.max_tokens})"
            )
        if self.tokenizer.vocab_size > config.vocab_size:
            raise ValueError(
                f"tokenizer vocabulary ({self.tokenizer.vocab_size}) exceeds config.vocab_size "
                f"({config.vocab_size})"
            )
        if self.stats.state.dim != config.proprio_dim:
            raise ValueError(
                f"norm_stats.state dim {self.stats.state.dim} != config.proprio_dim "
                f"{config.proprio_dim}"
            )
        if self.stats.action.dim != config.action_dim:
            raise ValueError(
                f"norm_stats.action dim {self.stats.action.dim} != config.action_dim "
                f"{config.action_dim}"
            )

    def __call__(
        self,
        images: Mapping[str, np.ndarray | torch.Tensor],
        state: np.ndarray | torch.Tensor,
        instruction: str | Sequence[str],
        actions: np.ndarray | torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Model batch from raw data: images {camera: uint8 [B, H, W, 3]}, state [B, Ds] (raw),
        instruction (one string for all, or B), optional absolute actions [B, H, A] (raw).
        Returns "images" [B, C, 3, S, S], "tokens"/"token_mask" [B, T], "state" [B, Ds] and
        (with actions) "actions" [B, H, A], all normalized."""
        c = self.config
        missing = [cam for cam in c.cameras if cam not in images]
        if missing:
            raise ValueError(f"images lack camera(s) {missing}; the model uses {list(c.cameras)}")
        imgs = torch.stack([preprocess_images(images[cam], c.image_size) for cam in c.cameras], 1)
        state_t = torch.as_tensor(state, dtype=torch.float32)
        b = state_t.shape[0]
        if imgs.shape[0] != b:
            raise ValueError(f"images have batch {imgs.shape[0]}, state has {b}")
        texts = [instruction] * b if isinstance(instruction, str) else list(instruction)
        if len(texts) != b:
            raise ValueError(f"{len(texts)} instructions for a batch of {b}")
        tokens, mask = self.tokenizer(texts)
        out = {
            "images": imgs,
            "tokens": tokens,
            "token_mask": mask,
            "state": self.stats.normalize("state", state_t),
        }
        if actions is not None:
            out["actions"] = self.actions_to_model(torch.as_tensor(actions), state_t)
        return out

    def actions_to_model(self, actions: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Absolute actions [B, H, A] (raw) -> normalized model targets in the stats'
        representation (state [B, Ds] raw)."""
        actions = actions.to(torch.float32)
        if self.stats.action_representation == "delta":
            actions = _delta(actions, state.to(torch.float32), -1.0)
        return self.stats.normalize("action", actions)

    def actions_from_model(self, chunk: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Inverse of `actions_to_model`: normalized chunk [B, H, A] -> absolute actions."""
        actions = self.stats.unnormalize("action", chunk)
        if self.stats.action_representation == "delta":
            actions = _delta(actions, torch.as_tensor(state, dtype=torch.float32), 1.0)
        return actions

    def to_dict(self) -> dict[str, Any]:
        """processor.json content."""
        return {
            "image_size": self.config.image_size,
            "cameras": list(self.config.cameras),
            "tokenizer": self.tokenizer.to_dict(),
            "norm_stats": self.stats.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], config: HoverflyVLAConfig) -> HoverflyVLAProcessor:
        """Inverse of `to_dict`, checked against the model `config`."""
        _check_keys("processor", data, {"image_size", "cameras", "tokenizer", "norm_stats"})
        if data["image_size"] != config.image_size:
            raise ValueError(
                f"processor image_size {data['image_size']} != config.image_size "
                f"{config.image_size}"
            )
        if tuple(data["cameras"]) != config.cameras:
            raise ValueError(
                f"processor cameras {data['cameras']} != config.cameras {list(config.cameras)}"
            )
        tokenizer = HoverflyTokenizer.from_dict(data["tokenizer"])
        return cls(config, NormStats.from_dict(data["norm_stats"]), tokenizer)
