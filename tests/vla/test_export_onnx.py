"""ONNX export of the compact VLA: ONNX Runtime Euler loop vs torch `sample_actions`, valid graphs,
dynamic batch, clear errors and atomic output."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.vla import make_batch, observation
from vla.checkpoint import save_checkpoint
from vla.configuration_hoverfly_vla import TEST
from vla.export_onnx import export_vla_onnx, sample_onnx
from vla.modeling_hoverfly_vla import HoverflyVLA
from vla.processor_hoverfly_vla import HoverflyVLAProcessor, compute_norm_stats

FILES = ["denoise_step.onnx", "prefix.onnx", "processor.json", "vla_onnx.json"]


def _checkpoint(path, config=TEST):
    model = HoverflyVLA(config, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    stats = compute_norm_stats(
        torch.randn(10, config.proprio_dim, generator=g),
        torch.randn(10, config.chunk_size, config.action_dim, generator=g),
    )
    return save_checkpoint(path, model, HoverflyVLAProcessor(config, stats)), model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    ckpt, model = _checkpoint(root / "ckpt")
    result = export_vla_onnx(ckpt, root / "out")
    return ckpt, model, root / "out", result


def test_export_layout_and_manifest(exported):
    ckpt, model, out, result = exported
    assert sorted(p.name for p in out.iterdir()) == FILES
    assert sorted(result["files"]) == FILES
    assert 0.0 <= result["max_abs_error"] < 1e-4
    for name in ("prefix.onnx", "denoise_step.onnx"):
        onnx.checker.check_model(onnx.load(out / name), full_check=True)
    assert (out / "processor.json").read_text() == (ckpt / "processor.json").read_text()
    manifest = json.loads((out / "vla_onnx.json").read_text())
    n = TEST.num_flow_steps
    assert manifest["sampler"]["num_flow_steps"] == n
    assert manifest["sampler"]["dt"] == pytest.approx(-1.0 / n)
    assert (manifest["sampler"]["t_start"], manifest["sampler"]["t_end"]) == (1.0, 0.0)
    assert list(manifest["prefix"]["inputs"]) == ["images", "tokens", "token_mask", "state"]
    assert list(manifest["prefix"]["outputs"]) == ["keys", "values", "mask", "pooled"]
    assert list(manifest["denoise_step"]["inputs"]) == ["keys", "values", "mask", "x_t", "t"]
    assert list(manifest["denoise_step"]["outputs"]) == ["velocity"]
    sess = ort.InferenceSession(str(out / "prefix.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == list(manifest["prefix"]["inputs"])
    assert all(isinstance(i.shape[0], str) for i in sess.get_inputs())  # dynamic batch


@pytest.mark.parametrize("batch", [2, 3])
def test_onnx_loop_matches_torch_sampler(exported, batch):
    _, model, out, _ = exported
    providers = ["CPUExecutionProvider"]
    sp = ort.InferenceSession(str(out / "prefix.onnx"), providers=providers)
    sd = ort.InferenceSession(str(out / "denoise_step.onnx"), providers=providers)
    obs = observation(make_batch(TEST, batch, seed=batch))
    g = torch.Generator().manual_seed(10 + batch)
    noise = torch.randn(batch, TEST.chunk_size, TEST.action_dim, generator=g)
    expected = model.sample_actions(obs, noise=noise).numpy()
    got = sample_onnx(sp, sd, obs, noise, TEST.num_flow_steps)
    assert got.shape == (batch, TEST.chunk_size, TEST.action_dim)
    assert float(np.max(np.abs(got - expected))) < 1e-4
    # the prefix outputs match embed_prefix too
    with torch.no_grad():
        cache = model.embed_prefix(obs)
    feeds = {k: obs[k].numpy() for k in ("images", "tokens", "token_mask", "state")}
    keys, values, mask, pooled = sp.run(None, feeds)
    np.testing.assert_allclose(keys, cache.keys.numpy(), atol=1e-5)
    np.testing.assert_allclose(pooled, cache.pooled.numpy(), atol=1e-5)
    np.testing.assert_array_equal(mask, cache.mask.numpy())


def test_cnn_encoder_exports_with_parity(tmp_path):
    """The CNN-keypoint encoder (conv, group norm, spatial softmax) exports too; the exporter's
    own parity check compares ONNX Runtime's Euler loop with torch's on held inputs."""
    config = TEST.replace(vision_encoder="cnn", image_size=64)
    ckpt, _ = _checkpoint(tmp_path / "ckpt", config)
    result = export_vla_onnx(ckpt, tmp_path / "out")
    assert 0.0 <= result["max_abs_error"] < 1e-4
    onnx.checker.check_model(onnx.load(tmp_path / "out" / "prefix.onnx"), full_check=True)


def test_invalid_checkpoint_raises(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint directory"):
        export_vla_onnx(tmp_path / "missing", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json: missing checkpoint file"):
        export_vla_onnx(tmp_path / "empty", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failed_export_leaves_nothing(tmp_path, monkeypatch):
    ckpt, _ = _checkpoint(tmp_path / "ckpt")

    def boom(*args, **kwargs):
        raise RuntimeError("export exploded")

    monkeypatch.setattr(torch.onnx, "export", boom)
    with pytest.raises(RuntimeError, match="export exploded"):
        export_vla_onnx(ckpt, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_parity_failure_and_replace(tmp_path):
    ckpt, _ = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="parity check failed"):
        export_vla_onnx(ckpt, out, tolerance=-1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    export_vla_onnx(ckpt, out, parity_batch=1)
    result = export_vla_onnx(ckpt, out, parity_batch=2)  # replaces the earlier export
    assert result["max_abs_error"] < 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "out"]
    assert sorted(p.name for p in out.iterdir()) == FILES
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not an ONNX VLA export"):
        export_vla_onnx(ckpt, other)
    assert sorted(p.name for p in other.iterdir()) == ["keep.txt"]
