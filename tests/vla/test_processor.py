"""Processor: tokenizer, image preprocessing, normalization statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vla.configuration_hoverfly_vla import TEST
from vla.modeling_hoverfly_vla import HoverflyVLA
from vla.processor_hoverfly_vla import (
    HoverflyTokenizer,
    HoverflyVLAProcessor,
    NormStats,
    compute_norm_stats,
    preprocess_images,
)


# -- tokenizer -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "Pick up the red cube and place it on the plate.",
        "push the zorblax into the bin, then wait",
        "Ünïcode ⊕ symbols 42 and digits",
        "",
    ],
)
def test_tokenizer_round_trip(text):
    tok = HoverflyTokenizer(max_tokens=64)
    assert tok.decode(tok.encode(text)) == tok.normalize(text)
    ids, mask = tok(text)
    assert tok.decode(ids[0]) == tok.normalize(text)  # padding skipped


def test_tokenizer_word_ids_and_byte_fallback():
    tok = HoverflyTokenizer(max_tokens=8)
    assert len(tok.encode("pick the red cube")) == 4  # all built-in words
    assert len(tok.encode("zorb")) == 4  # bytes
    assert tok.decode(tok.encode("zorb blip")) == "zorb blip"  # byte pieces kept apart
    assert tok.encode("PICK") == tok.encode("pick")
    assert tok.vocab_size <= TEST.vocab_size


def test_tokenizer_padding_and_truncation():
    tok = HoverflyTokenizer(max_tokens=5)
    ids, mask = tok(["pick the cube", "pick up the red cube and place it"])
    assert ids.shape == mask.shape == (2, 5) and ids.dtype == torch.int64
    assert mask[0].tolist() == [True, True, True, False, False]
    assert ids[0, 3:].tolist() == [0, 0] and mask[1].all()
    assert tok.decode(ids[1]) == "pick up the red cube"


def test_tokenizer_json_round_trip():
    tok = HoverflyTokenizer(max_tokens=7)
    back = HoverflyTokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
    assert back.encode("stack the blocks") == tok.encode("stack the blocks")
    with pytest.raises(ValueError, match="tokenizer.type"):
        HoverflyTokenizer.from_dict({**tok.to_dict(), "type": "bpe"})


# -- images ----------------------------------------------------------------------------------------
def test_preprocess_images():
    img = np.zeros((2, 48, 40, 3), np.uint8)
    img[..., 0] = 255
    out = preprocess_images(img, 32)
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.float32
    torch.testing.assert_close(out[:, 0], torch.ones(2, 32, 32))
    torch.testing.assert_close(out[:, 1:], -torch.ones(2, 2, 32, 32))
    same = preprocess_images(np.full((32, 32, 3), 128, np.uint8), 32)  # no resize, unbatched
    assert same.shape == (3, 32, 32) and abs(float(same.mean()) - (128 / 127.5 - 1)) < 1e-6
    with pytest.raises(ValueError, match="uint8"):
        preprocess_images(np.zeros((32, 32, 3), np.float32), 32)
    with pytest.raises(ValueError, match="shape"):
        preprocess_images(np.zeros((32, 32, 4), np.uint8), 32)


# -- norm stats ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["mean_std", "min_max"])
def test_norm_stats_round_trip(mode):
    g = torch.Generator().manual_seed(0)
    states = torch.randn(200, 3, generator=g) * torch.tensor([1.0, 10.0, 0.1]) + 5
    actions = torch.rand(200, 6, 2, generator=g) * 4 - 1
    stats = compute_norm_stats(states, actions, mode=mode)
    s = stats.normalize("state", states)
    a = stats.normalize("action", actions)
    if mode == "mean_std":
        torch.testing.assert_close(s.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
        torch.testing.assert_close(s.std(0, unbiased=False), torch.ones(3), atol=1e-3, rtol=0)
    else:
        assert a.min() >= -1 - 1e-5 and a.max() <= 1 + 1e-5
        torch.testing.assert_close(s.amin(0), -torch.ones(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(stats.unnormalize("action", a), actions, atol=1e-5, rtol=1e-5)
    back = NormStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert back == stats


def test_norm_stats_errors():
    stats = compute_norm_stats(torch.zeros(4, 3), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="action: last dim"):
        stats.normalize("action", torch.zeros(5, 3))
    with pytest.raises(ValueError, match="state: last dim"):
        stats.unnormalize("state", torch.zeros(2))
    with pytest.raises(ValueError, match="mode"):
        compute_norm_stats(torch.zeros(4, 3), torch.zeros(4, 2), mode="zscore")
    with pytest.raises(ValueError, match="unknown norm_stats key"):
        NormStats.from_dict({**stats.to_dict(), "extra": 1})
    with pytest.raises(ValueError, match="missing norm_stats.state key.*std"):
        d = stats.to_dict()
        del d["state"]["std"]
        NormStats.from_dict(d)


def test_delta_representation():
    """Delta stats describe action - state[:A]; the processor converts both ways."""
    g = torch.Generator().manual_seed(1)
    c = TEST
    states = torch.randn(32, c.proprio_dim, generator=g) * 3
    actions = states[:, None, : c.action_dim] + 0.1 * torch.randn(32, c.chunk_size, 4, generator=g)
    stats = compute_norm_stats(states, actions, action_representation="delta")
    assert stats.action_representation == "delta"
    assert max(abs(m) for m in stats.action.mean) < 0.1  # deltas, not absolute positions
    proc = HoverflyVLAProcessor(c, stats)
    model_actions = proc.actions_to_model(actions, states)
    torch.testing.assert_close(proc.actions_from_model(model_actions, states), actions)


# -- processor -------------------------------------------------------------------------------------
def test_processor_feeds_the_model_and_round_trips():
    c = TEST
    g = torch.Generator().manual_seed(2)
    states = torch.randn(3, c.proprio_dim, generator=g)
    actions = torch.randn(3, c.chunk_size, c.action_dim, generator=g)
    proc = HoverflyVLAProcessor(c, compute_norm_stats(states, actions, mode="min_max"))
    images = {
        cam: np.random.default_rng(0).integers(0, 256, (3, 48, 48, 3), np.uint8)
        for cam in ("wrist", "front")
    }
    batch = proc(images, states, "pick the red cube", actions)
    assert batch["images"].shape == (3, 2, 3, c.image_size, c.image_size)
    assert batch["tokens"].shape == (3, c.max_tokens)
    model = HoverflyVLA(c, torch.Generator().manual_seed(0))
    assert torch.isfinite(model.flow_matching_loss(batch))
    back = HoverflyVLAProcessor.from_dict(json.loads(json.dumps(proc.to_dict())), c)
    assert back.stats == proc.stats and back.tokenizer.to_dict() == proc.tokenizer.to_dict()
    with pytest.raises(ValueError, match="camera"):
        proc({"front": images["front"]}, states, "pick")
    with pytest.raises(ValueError, match="image_size"):
        HoverflyVLAProcessor.from_dict(proc.to_dict(), c.replace(image_size=64))
    with pytest.raises(ValueError, match="proprio_dim"):
        HoverflyVLAProcessor(c.replace(proprio_dim=5), proc.stats)
