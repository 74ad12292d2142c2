"""Run-folder API: config.json, atomic checkpoints, metrics.csv, load_run (no training here)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from algos import get_preset
from algos.run_folder import (
    MetricsLog,
    RunError,
    checkpoint_path,
    config_diff,
    config_hash,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_run,
    make_env_and_network,
    read_config,
    read_metrics,
    save_checkpoint,
    trim_metrics,
    write_config,
)
from policies import NetworkConfig


def _cfg(**ppo):
    cfg = get_preset("quadrotor-hover", "cpu", "ppo")
    return dataclasses.replace(
        cfg, ppo=dataclasses.replace(cfg.ppo, total_timesteps=16384, num_envs=64, **ppo)
    )


def _state(cfg, seed=0):
    """Params and optimizer state shaped like the learner's, without running it."""
    env, network = make_env_and_network(cfg)
    params = network.init(jax.random.key(seed))
    opt_state = optax.adam(1e-3).init(params)
    return params, opt_state


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_config_round_trip_and_hash(tmp_path):
    cfg = _cfg()
    write_config(tmp_path, cfg)
    assert read_config(tmp_path) == cfg
    doc = json.loads((tmp_path / "config.json").read_text())
    assert doc["config_hash"] == config_hash(cfg) and doc["config"]["ppo"]["num_envs"] == 64
    assert config_hash(dataclasses.replace(cfg, seed=1)) != config_hash(cfg)
    assert not list(tmp_path.glob(".*.tmp"))


def test_config_diff_names_fields():
    a = _cfg()
    b = dataclasses.replace(a, seed=3, ppo=dataclasses.replace(a.ppo, num_envs=128))
    assert [k for k, _, _ in config_diff(a, b)] == ["ppo.num_envs", "seed"]
    assert config_diff(a, a) == []


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"config": ', "not valid JSON"),
        ("[1, 2]", "expected an object"),
        ('{"config": {"sed": 1}, "config_hash": "x"}', "unknown field"),
        ('{"config": {"seed": "one"}, "config_hash": "x"}', "config.seed"),
        ('{"config": {"task": "fly"}, "config_hash": "x"}', "unknown task"),
        ('{"config": {}, "config_hash": "0"}', "config_hash does not match"),
    ],
)
def test_malformed_config_is_one_line_error(tmp_path, text, match):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(RunError, match=match) as err:
        read_config(tmp_path)
    assert "\n" not in str(err.value) and "config.json" in str(err.value)
    assert (tmp_path / "config.json").read_text() == text


def test_missing_folder_and_missing_config(tmp_path):
    with pytest.raises(RunError, match="does not exist"):
        read_config(tmp_path / "nope")
    with pytest.raises(RunError, match="not a run folder"):
        read_config(tmp_path)
    write_config(tmp_path, _cfg())
    with pytest.raises(RunError, match="no checkpoint"):
        load_run(tmp_path)


def test_checkpoint_round_trip_with_typed_key(tmp_path):
    params, opt_state = _state(_cfg())
    key = jax.random.split(jax.random.key(7))[1]
    path = save_checkpoint(tmp_path, 12, params, opt_state, key, "abc")
    assert path == checkpoint_path(tmp_path, 12) == latest_checkpoint(tmp_path)
    like_p, like_o = jax.eval_shape(lambda: (params, opt_state))
    ckpt = load_checkpoint(path, like_p, like_o, "abc")
    assert ckpt.update == 12 and ckpt.config_hash == "abc"
    for a, b in zip(jax.tree.leaves((params, opt_state)), jax.tree.leaves(ckpt[2:4]), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(ckpt.opt_state) == jax.tree.structure(opt_state)
    np.testing.assert_array_equal(jax.random.key_data(ckpt.key), jax.random.key_data(key))
    np.testing.assert_array_equal(jax.random.normal(ckpt.key, (3,)), jax.random.normal(key, (3,)))


def test_latest_checkpoint_and_pruning(tmp_path):
    params, opt_state = _state(_cfg())
    assert latest_checkpoint(tmp_path) is None
    for u in (2, 4, 10, 6, 8):
        save_checkpoint(tmp_path, u, params, opt_state, jax.random.key(0), "h", keep=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt_00000006.msgpack",
        "ckpt_00000008.msgpack",
        "ckpt_00000010.msgpack",
    ]
    assert latest_checkpoint(tmp_path).name == "ckpt_00000010.msgpack"
    assert not list((tmp_path / "checkpoints").glob(".*"))


def test_bad_checkpoints_are_one_line_errors(tmp_path):
    params, opt_state = _state(_cfg())
    like = jax.eval_shape(lambda: params)
    path = save_checkpoint(tmp_path, 1, params, opt_state, jax.random.key(0), "h")
    data = path.read_bytes()
    cases = {
        "truncated": (data[: len(data) // 2], "truncated or corrupt"),
        "empty": (b"", "truncated or corrupt"),
        "garbage": (b"\x00\x01not msgpack", "checkpoint"),
    }
    for name, (content, match) in cases.items():
        path.write_bytes(content)
        with pytest.raises(RunError, match=match) as err:
            load_checkpoint(path, like)
        assert "\n" not in str(err.value), name
        assert path.read_bytes() == content
    path.write_bytes(data)
    with pytest.raises(RunError, match="different config"):
        load_checkpoint(path, like, cfg_hash="other")
    # Wrong shapes: a checkpoint of a different network.
    small, _ = _state(
        dataclasses.replace(
            _cfg(), ppo=dataclasses.replace(_cfg().ppo, network=NetworkConfig(actor_hidden=(32,)))
        )
    )
    with pytest.raises(RunError, match=r"(missing|unexpected) params\.actor\.") as err:
        load_checkpoint(path, jax.eval_shape(lambda: small))
    assert "\n" not in str(err.value)
    wrong = jax.tree.map(lambda x: jnp.zeros(x.shape + (2,), x.dtype), like)
    with pytest.raises(RunError, match=r"params\..* is float32\[.*\], expected"):
        load_checkpoint(path, wrong)


def test_checkpoint_missing_keys(tmp_path):
    from flax import serialization

    params, opt_state = _state(_cfg())
    path = save_checkpoint(tmp_path, 1, params, opt_state, jax.random.key(0), "h")
    state = serialization.msgpack_restore(path.read_bytes())
    del state["key_data"]
    path.write_bytes(serialization.msgpack_serialize(state))
    with pytest.raises(RunError, match="missing key_data"):
        load_checkpoint(path, jax.eval_shape(lambda: params))
    state = serialization.msgpack_restore(
        save_checkpoint(tmp_path, 2, params, opt_state, jax.random.key(0), "h").read_bytes()
    )
    del state["params"]["log_std"]
    checkpoint_path(tmp_path, 2).write_bytes(serialization.msgpack_serialize(state))
    with pytest.raises(RunError, match=r"missing params\.log_std"):
        load_checkpoint(checkpoint_path(tmp_path, 2), jax.eval_shape(lambda: params))


def test_metrics_append_trim_and_partial_lines(tmp_path):
    log = MetricsLog(tmp_path)
    for u in range(1, 6):
        log.append({"update": u, "env_steps": 10 * u, "loss": 0.5 * u})
    with open(tmp_path / "metrics.csv", "a") as f:
        f.write("6,60,3.")  # a write cut short by a kill
    assert [r["update"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    trim_metrics(tmp_path, 3)
    assert [r["update"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    log = MetricsLog(tmp_path)  # resumed session: same header, extra keys ignored
    log.append({"update": 4, "env_steps": 40, "loss": 2.0, "new": 1.0})
    rows = read_metrics(tmp_path)
    assert [r["update"] for r in rows] == [1, 2, 3, 4] and rows[-1] == {
        "update": 4.0,
        "env_steps": 40.0,
        "loss": 2.0,
    }
    text = (tmp_path / "metrics.csv").read_text()
    trim_metrics(tmp_path, 10)
    assert (tmp_path / "metrics.csv").read_text() == text


def test_load_run_rebuilds_network_and_env(tmp_path):
    cfg = _cfg()
    write_config(tmp_path, cfg)
    env, network = make_env_and_network(cfg)
    params, opt_state = _state(cfg, seed=4)
    save_checkpoint(tmp_path, 3, params, opt_state, jax.random.key(0), config_hash(cfg))
    before = _files(tmp_path)
    run = load_run(tmp_path)
    assert run.config == cfg and run.update == 3
    assert run.env.observation_size == env.observation_size
    obs = jnp.ones((5, env.observation_size["state"][0]))
    np.testing.assert_array_equal(
        run.network.actor(run.params, obs)[0], network.actor(params, obs)[0]
    )
    assert _files(tmp_path) == before
