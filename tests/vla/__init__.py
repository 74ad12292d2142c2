"""Tests of the compact VLA (`vla/`). Shared helpers: a synthetic observation batch."""

from __future__ import annotations

import torch

from vla.configuration_hoverfly_vla import HoverflyVLAConfig
from vla.processor_hoverfly_vla import HoverflyTokenizer

INSTRUCTIONS = ("pick the red cube", "push the blue block", "open the drawer", "lift the ball")


def make_batch(config: HoverflyVLAConfig, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A model batch of `n` synthetic samples whose action chunk [H, A] is a deterministic function
    of the state (linear map) and the instruction (a per-instruction ramp over the chunk)."""
    g = torch.Generator().manual_seed(seed)
    c = config
    ids, mask = HoverflyTokenizer(c.max_tokens)([INSTRUCTIONS[i % 4] for i in range(n)])
    s = c.image_size
    images = torch.rand(n, len(c.cameras), 3, s, s, generator=g) * 2 - 1
    state = torch.randn(n, c.proprio_dim, generator=g)
    w = torch.randn(c.proprio_dim, c.action_dim, generator=g) * 0.5
    ramp = torch.linspace(0, 1, c.chunk_size)[None, :, None]
    instr = (torch.arange(n) % 4).to(torch.float32)[:, None, None]
    actions = torch.tanh((state @ w)[:, None, :] + ramp * (instr - 1.5) / 1.5)
    return {
        "images": images,
        "tokens": ids,
        "token_mask": mask,
        "state": state,
        "actions": actions,
    }


def observation(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch without its training targets."""
    return {k: v for k, v in batch.items() if k not in ("actions", "action_is_pad")}
