"""Checkpoint folders: bit-identical round trip, atomic writes, validated loading."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import vla.checkpoint as ckpt
from tests.vla import make_batch, observation
from vla.checkpoint import load_checkpoint, load_train_state, save_checkpoint
from vla.configuration_hoverfly_vla import TEST
from vla.modeling_hoverfly_vla import HoverflyVLA
from vla.processor_hoverfly_vla import HoverflyVLAProcessor, compute_norm_stats


def _parts():
    model = HoverflyVLA(TEST, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    stats = compute_norm_stats(
        torch.randn(10, TEST.proprio_dim, generator=g),
        torch.randn(10, TEST.chunk_size, TEST.action_dim, generator=g),
    )
    return model, HoverflyVLAProcessor(TEST, stats)


@pytest.fixture()
def saved(tmp_path):
    model, proc = _parts()
    return save_checkpoint(tmp_path / "ckpt", model, proc), model, proc


def test_round_trip_is_bit_identical(saved):
    path, model, proc = saved
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "processor.json",
    ]
    loaded, loaded_proc = load_checkpoint(path)
    assert loaded.config == model.config and not loaded.training
    assert loaded_proc.to_dict() == proc.to_dict()
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    obs = observation(make_batch(TEST, 2))
    noise = torch.randn(2, TEST.chunk_size, TEST.action_dim)
    assert torch.equal(model.sample_actions(obs, noise), loaded.sample_actions(obs, noise))
    with torch.no_grad():
        assert torch.equal(model.value(obs), loaded.value(obs))


def test_train_state_and_overwrite(saved, tmp_path):
    path, model, proc = saved
    assert load_train_state(path) is None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.flow_matching_loss(make_batch(TEST, 2)).backward()
    opt.step()
    save_checkpoint(path, model, proc, {"step": 7, "optimizer": opt.state_dict()})  # replaces
    state = load_train_state(path)
    assert state["step"] == 7
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt2.load_state_dict(state["optimizer"])
    exp_avg = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], exp_avg)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp / old folders left


def test_failed_save_leaves_nothing(tmp_path, monkeypatch):
    model, proc = _parts()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "ckpt", model, proc)
    assert list(tmp_path.iterdir()) == []


def _edit_json(path, name, fn):
    data = json.loads((path / name).read_text())
    fn(data)
    (path / name).write_text(json.dumps(data))


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "processor.json"])
def test_missing_file(saved, name):
    path = saved[0]
    os.remove(path / name)
    with pytest.raises(ValueError, match=f"{name}: missing checkpoint file"):
        load_checkpoint(path)


def test_config_key_errors(saved):
    path = saved[0]
    _edit_json(path, "config.json", lambda d: d.update(bogus=1))
    with pytest.raises(ValueError, match="config.json: unknown HoverflyVLAConfig key.*bogus"):
        load_checkpoint(path)
    _edit_json(path, "config.json", lambda d: (d.pop("bogus"), d.pop("chunk_size")))
    with pytest.raises(ValueError, match="config.json: missing HoverflyVLAConfig key.*chunk_size"):
        load_checkpoint(path)


def test_bad_json(saved):
    path = saved[0]
    (path / "processor.json").write_text("{not json")
    with pytest.raises(ValueError, match="processor.json: not valid JSON"):
        load_checkpoint(path)


def test_processor_mismatch(saved):
    path = saved[0]
    _edit_json(path, "processor.json", lambda d: d["norm_stats"]["action"]["mean"].append(0.0))
    with pytest.raises(ValueError, match="processor.json: .*common non-zero length"):
        load_checkpoint(path)


def test_tensor_shape_mismatch(saved):
    path = saved[0]
    _edit_json(path, "config.json", lambda d: d.update(chunk_size=9))
    with pytest.raises(ValueError, match="model.safetensors: tensor 'action_pos' has shape"):
        load_checkpoint(path)


def test_missing_tensor(saved):
    path = saved[0]
    tensors = load_file(path / "model.safetensors")
    del tensors["value_head.0.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors: missing tensor.*value_head.0.weight"):
        load_checkpoint(path)


def test_corrupt_safetensors(saved):
    path = saved[0]
    file = path / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors: corrupt safetensors"):
        load_checkpoint(path)
