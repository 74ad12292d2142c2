"""ONNX export of the compact VLA (`HoverflyVLA`) as two graphs plus a JSON manifest:

    <out>/prefix.onnx        images [B, C, 3, S, S] float32, tokens int64 [B, T],
                             token_mask bool [B, T], state float32 [B, P]
                             -> keys, values [L_e, B, n_heads, P, head_dim], mask bool [B, P],
                                pooled [B, d_model]
    <out>/denoise_step.onnx  keys, values, mask, x_t [B, H, A], t [B] -> velocity [B, H, A]
    <out>/vla_onnx.json      input / output names, shapes, the flow-step count and the Euler loop
    <out>/processor.json     the checkpoint's processor (tokenizer, image size, norm stats)

The runtime encodes the prefix once, then runs the model's deterministic sampler
(`HoverflyVLA.sample_actions`): x_0 = noise at t = 1, and for k = 0 .. N - 1
t_k = 1 - k / N, x_{k+1} = x_k + dt · denoise_step(keys, values, mask, x_k, t_k) with dt = -1 / N;
x_N are the (normalized) actions. `sample_onnx` is that loop over ONNX Runtime sessions.

Everything is written into a hidden temporary folder beside `out_dir`, checked for parity against
torch's `sample_actions` with ONNX Runtime, and only then renamed into place, so a failed export or
parity check never leaves a half-written `out_dir`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vla.checkpoint import PROCESSOR_NAME, load_checkpoint, replace_dir
from vla.modeling_hoverfly_vla import HoverflyVLA, PrefixCache

__all__ = [
    "DENOISE_INPUTS",
    "DENOISE_NAME",
    "DENOISE_OUTPUTS",
    "MANIFEST_NAME",
    "PREFIX_INPUTS",
    "PREFIX_NAME",
    "PREFIX_OUTPUTS",
    "export_vla_onnx",
    "sample_onnx",
]

PREFIX_NAME = "prefix.onnx"
DENOISE_NAME = "denoise_step.onnx"
MANIFEST_NAME = "vla_onnx.json"
PREFIX_INPUTS = ("images", "tokens", "token_mask", "state")
PREFIX_OUTPUTS = ("keys", "values", "mask", "pooled")
DENOISE_INPUTS = ("keys", "values", "mask", "x_t", "t")
DENOISE_OUTPUTS = ("velocity",)


class _Prefix(nn.Module):
    def __init__(self, model: HoverflyVLA):
        super().__init__()
        self.model = model

    def forward(self, images, tokens, token_mask, state):
        obs = {"images": images, "tokens": tokens, "token_mask": token_mask, "state": state}
        return tuple(self.model.embed_prefix(obs))


class _Denoise(nn.Module):
    def __init__(self, model: HoverflyVLA):
        super().__init__()
        self.model = model

    def forward(self, keys, values, mask, x_t, t):
        cache = PrefixCache(keys, values, mask, None)
        return self.model.denoise_step(cache, x_t, t)


def _example_obs(model: HoverflyVLA, b: int, seed: int) -> dict[str, torch.Tensor]:
    """A synthetic observation batch of size `b` (export example and parity input)."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    s = c.image_size
    lengths = torch.randint(1, c.max_tokens + 1, (b,), generator=g)
    return {
        "images": torch.rand(b, len(c.cameras), 3, s, s, generator=g) * 2 - 1,
        "tokens": torch.randint(0, c.vocab_size, (b, c.max_tokens), generator=g),
        "token_mask": torch.arange(c.max_tokens)[None, :] < lengths[:, None],
        "state": torch.randn(b, c.proprio_dim, generator=g),
    }


def _to_numpy(obs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for name in PREFIX_INPUTS:
        if name not in obs:
            raise ValueError(f"observation lacks {name!r} (needs {list(PREFIX_INPUTS)})")
        v = obs[name]
        v = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        dtype = {"tokens": np.int64, "token_mask": np.bool_}.get(name, np.float32)
        out[name] = np.ascontiguousarray(v.astype(dtype, copy=False))
    return out


def sample_onnx(
    session_prefix: Any,
    session_denoise: Any,
    obs: Mapping[str, Any],
    noise: Any,
    num_steps: int,
) -> np.ndarray:
    """Actions [B, H, A] (normalized) from ONNX Runtime sessions of `prefix.onnx` and
    `denoise_step.onnx`: the same Euler loop as `HoverflyVLA.sample_actions` (t = 1 -> 0,
    t_k = 1 - k / N, x <- x + dt · v with dt = -1 / N). `obs` holds the prefix inputs (torch
    tensors or arrays), `noise` [B, H, A] the initial x at t = 1."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps <= 0:
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    feeds = _to_numpy(obs)
    keys, values, mask, _ = session_prefix.run(list(PREFIX_OUTPUTS), feeds)
    if isinstance(noise, torch.Tensor):
        noise = noise.detach().cpu().numpy()
    x = np.ascontiguousarray(np.asarray(noise, dtype=np.float32))
    b = x.shape[0]
    dt = np.float32(-1.0 / num_steps)
    for k in range(num_steps):
        t = np.full((b,), 1.0 - k / num_steps, dtype=np.float32)
        feeds = {"keys": keys, "values": values, "mask": mask, "x_t": x, "t": t}
        (v,) = session_denoise.run(list(DENOISE_OUTPUTS), feeds)
        x = x + dt * v
    return x


def _export(model: HoverflyVLA, tmp: Path, opset: int) -> None:
    with warnings.catch_warnings():
        # the tracer's notes on the model's Python-side shape checks and constant folding: the
        # batch dimension stays dynamic (checked by the parity run at another batch size)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="Constant folding", category=UserWarning)
        # dynamo=False on purpose: the torch.export-based exporter needs onnxscript (not a dep)
        warnings.filterwarnings(
            "ignore", message=".*legacy TorchScript", category=DeprecationWarning
        )
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        _export_graphs(model, tmp, opset)


def _export_graphs(model: HoverflyVLA, tmp: Path, opset: int) -> None:
    c = model.config
    obs = _example_obs(model, 2, seed=0)
    args = tuple(obs[k] for k in PREFIX_INPUTS)
    batch = {"images": {0: "batch"}, "tokens": {0: "batch"}, "token_mask": {0: "batch"}}
    batch |= {"state": {0: "batch"}, "keys": {1: "batch"}, "values": {1: "batch"}}
    batch |= {"mask": {0: "batch"}, "pooled": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(
            _Prefix(model),
            args,
            str(tmp / PREFIX_NAME),
            input_names=list(PREFIX_INPUTS),
            output_names=list(PREFIX_OUTPUTS),
            dynamic_axes={k: batch[k] for k in PREFIX_INPUTS + PREFIX_OUTPUTS},
            opset_version=opset,
            dynamo=False,
        )
        cache = model.embed_prefix(obs)
        x_t = torch.randn(2, c.chunk_size, c.action_dim, generator=torch.Generator().manual_seed(1))
        t = torch.full((2,), 0.5)
        dyn = {k: batch[k] for k in ("keys", "values", "mask")}
        dyn |= {"x_t": {0: "batch"}, "t": {0: "batch"}, "velocity": {0: "batch"}}
        torch.onnx.export(
            _Denoise(model),
            (cache.keys, cache.values, cache.mask, x_t, t),
            str(tmp / DENOISE_NAME),
            input_names=list(DENOISE_INPUTS),
            output_names=list(DENOISE_OUTPUTS),
            dynamic_axes=dyn,
            opset_version=opset,
            dynamo=False,
        )


def _manifest(model: HoverflyVLA, opset: int) -> dict[str, Any]:
    c = model.config
    n_cam, s, t_len = len(c.cameras), c.image_size, c.max_tokens
    kv = [len(c.expert_kv_layers), "B", c.n_heads, c.prefix_len, c.head_dim]
    n = c.num_flow_steps
    return {
        "format": "hoverfly_vla_onnx",
        "version": 1,
        "opset": opset,
        "config": c.to_dict(),
        "processor": PROCESSOR_NAME,
        "prefix": {
            "file": PREFIX_NAME,
            "inputs": {
                "images": {"shape": ["B", n_cam, 3, s, s], "dtype": "float32"},
                "tokens": {"shape": ["B", t_len], "dtype": "int64"},
                "token_mask": {"shape": ["B", t_len], "dtype": "bool"},
                "state": {"shape": ["B", c.proprio_dim], "dtype": "float32"},
            },
            "outputs": {
                "keys": {"shape": kv, "dtype": "float32"},
                "values": {"shape": kv, "dtype": "float32"},
                "mask": {"shape": ["B", c.prefix_len], "dtype": "bool"},
                "pooled": {"shape": ["B", c.d_model], "dtype": "float32"},
            },
        },
        "denoise_step": {
            "file": DENOISE_NAME,
            "inputs": {
                "keys": {"shape": kv, "dtype": "float32"},
                "values": {"shape": kv, "dtype": "float32"},
                "mask": {"shape": ["B", c.prefix_len], "dtype": "bool"},
                "x_t": {"shape": ["B", c.chunk_size, c.action_dim], "dtype": "float32"},
                "t": {"shape": ["B"], "dtype": "float32"},
            },
            "outputs": {
                "velocity": {"shape": ["B", c.chunk_size, c.action_dim], "dtype": "float32"},
            },
        },
        "sampler": {
            "num_flow_steps": n,
            "t_start": 1.0,
            "t_end": 0.0,
            "dt": -1.0 / n,
            "loop": (
                "keys, values, mask, pooled = prefix(images, tokens, token_mask, state); "
                "x = noise ~ N(0, I) [B, H, A]; for k in 0..N-1: t = full(B, 1 - k / N); "
                "x = x + dt * denoise_step(keys, values, mask, x, t) with dt = -1 / N; "
                "actions = x (normalized: unnormalize with processor.json)"
            ),
        },
    }


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ValueError(f"{out_dir}: exists and is not a directory")
        if any(out_dir.iterdir()) and not (out_dir / MANIFEST_NAME).is_file():
            raise ValueError(f"{out_dir}: non-empty directory that is not an ONNX VLA export")


def export_vla_onnx(
    checkpoint_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    opset: int = 17,
    parity_batch: int = 3,
    tolerance: float = 1e-4,
    seed: int = 0,
) -> dict[str, Any]:
    """Exports the checkpoint at `checkpoint_dir` (see `vla.checkpoint`) to `out_dir` (module
    docstring layout), atomically; an existing export at `out_dir` is replaced.

    Before `out_dir` is written, the looped ONNX Runtime sampler (`sample_onnx`) is compared with
    torch's `sample_actions` on a synthetic batch of `parity_batch` observations and shared noise;
    raises ValueError when the max abs error exceeds `tolerance` (and on an invalid checkpoint).
    Returns {"max_abs_error": float, "files": {name: path}}."""
    import onnxruntime as ort

    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    model, _ = load_checkpoint(checkpoint_dir)  # ValueError naming the bad file / field
    model = model.float().eval()
    _check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _export(model, tmp, opset)
        shutil.copyfile(checkpoint_dir / PROCESSOR_NAME, tmp / PROCESSOR_NAME)
        manifest = _manifest(model, opset)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")

        # parity: ONNX Runtime loop vs torch sample_actions
        c = model.config
        obs = _example_obs(model, parity_batch, seed)
        g = torch.Generator().manual_seed(seed + 1)
        noise = torch.randn(parity_batch, c.chunk_size, c.action_dim, generator=g)
        expected = model.sample_actions(obs, noise=noise).numpy()
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        sp = ort.InferenceSession(str(tmp / PREFIX_NAME), opts, providers=providers)
        sd = ort.InferenceSession(str(tmp / DENOISE_NAME), opts, providers=providers)
        got = sample_onnx(sp, sd, obs, noise, c.num_flow_steps)
        err = float(np.max(np.abs(got - expected)))
        if not err <= tolerance:  # also catches NaN
            raise ValueError(
                f"ONNX parity check failed: max abs error {err:.3g} > tolerance {tolerance:g}"
            )

        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    names = (PREFIX_NAME, DENOISE_NAME, MANIFEST_NAME, PROCESSOR_NAME)
    return {"max_abs_error": err, "files": {n: str(out_dir / n) for n in names}}
