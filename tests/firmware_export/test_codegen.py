"""Generated C on the host: parity with the numpy references, the history logic against the
simulator's observations, the tanh approximation, bad input. Compiled with the host's cc,
warnings as errors (the Cortex-M4 build is in test_qemu.py)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from algos.run_folder import RunError, load_run
from deploy.policy import DensePolicy, forward, record_rollouts
from deploy.quantize import calibrate_int8, int8_forward
from firmware_export import activations, codegen, int8_model
from firmware_export.export import compile_host_driver, host_actions


@pytest.fixture(scope="module")
def rollouts(hover_run):
    """Calibration and held-out closed-loop rollouts of the shipped run's JAX policy."""
    run = load_run(hover_run)
    return {
        "calibration": record_rollouts(run, 8, jax.random.key(11)),
        "held_out": record_rollouts(run, 8, jax.random.key(12)),
    }


@pytest.fixture(scope="module")
def int8_policy(hover_policy, rollouts):
    return calibrate_int8(hover_policy, rollouts["calibration"]["obs"])


def _build(tmp_path, policy, states=None):
    for name, text in codegen.generate_c(policy, example_inputs=states).items():
        (tmp_path / name).write_text(text)
    return compile_host_driver(tmp_path, tmp_path / "host")


def _self_test(exe) -> int:
    import subprocess

    return subprocess.run([exe, "test"]).returncode


def test_f32_matches_forward(tmp_path, hover_policy, rollouts):
    held = rollouts["held_out"]
    exe = _build(tmp_path, hover_policy, held["episode_obs"][:10, 0, :18])
    assert _self_test(exe) == 0
    obs = held["obs"]
    diff = np.abs(host_actions(exe, obs) - forward(hover_policy, obs))
    assert diff.max() <= codegen.F32_TOLERANCE, diff.max()


def test_int8_matches_integer_reference(tmp_path, hover_policy, int8_policy, rollouts):
    exe = _build(tmp_path, int8_policy, rollouts["held_out"]["episode_obs"][:10, 1, :18])
    assert _self_test(exe) == 0
    obs = rollouts["held_out"]["obs"]
    actions = host_actions(exe, obs)
    # Bit-exact against the C's own arithmetic in numpy...
    np.testing.assert_array_equal(actions, int8_model.forward(int8_model.build(int8_policy), obs))
    # ...which differs from deploy.quantize's reference only by rare one-step roundings.
    ref = int8_forward(int8_policy, obs)
    assert np.mean(np.all(actions == ref, axis=1)) >= 0.99
    assert np.abs(actions - ref).max() <= 0.01
    # Against the float policy, no worse than the reference int8 scheme (+ that rounding); its
    # worst case depends on the checkpoint (held-out states outside the calibrated ranges), the
    # typical error is small.
    err_c = np.abs(actions - forward(hover_policy, obs))
    err_ref = np.abs(ref - forward(hover_policy, obs))
    assert err_c.max() <= err_ref.max() + 0.01, (err_c.max(), err_ref.max())
    assert np.quantile(err_c, 0.99) <= np.quantile(err_ref, 0.99) + 0.005 < 0.2


def _alive_episodes(episode_obs: np.ndarray, steps: int) -> list[int]:
    """Episodes whose observation changes at every one of the first `steps` steps (a terminated
    episode is frozen by the rollout)."""
    moving = np.any(episode_obs[1 : steps + 1] != episode_obs[:steps], axis=-1).all(axis=0)
    return [int(b) for b in np.flatnonzero(moving)]


def test_history_matches_simulator(tmp_path, hover_policy, rollouts):
    """policy_control over an episode's states (the history kept inside the C) reproduces the
    JAX policy's actions, which the simulator reports as the newest history entry next step."""
    episode_obs = rollouts["held_out"]["episode_obs"]
    steps = 60
    episodes = _alive_episodes(episode_obs, steps)
    assert episodes, "no episode of the held-out set flew 60 steps"
    exe = _build(tmp_path, hover_policy)
    for b in episodes[:3]:
        obs = episode_obs[: steps + 1, b]
        # The simulator resets the history to the episode's own (randomized) hover action; the
        # driver sets it from the first observation through policy_push_action.
        actions = host_actions(exe, obs[:steps], mode="episode")
        jax_actions = obs[1 : steps + 1, 18:22]
        np.testing.assert_allclose(actions, jax_actions, atol=2e-5, rtol=0)
        assert np.abs(np.diff(jax_actions, axis=0)).max() > 1e-3  # the history really moves


def test_int8_history_matches_model(tmp_path, int8_policy, rollouts):
    obs = rollouts["held_out"]["episode_obs"][:40, 2]
    exe = _build(tmp_path, int8_policy)
    actions = host_actions(exe, obs, mode="episode")
    model = int8_model.build(int8_policy)
    history, expected = obs[0, 18:].copy(), []
    for row in obs:
        a = int8_model.forward(model, np.concatenate([row[:18], history])[None])[0]
        expected.append(a)
        history = np.concatenate([a, history[:-4]])
    np.testing.assert_array_equal(actions, np.stack(expected))


def test_reference_network_without_history(tmp_path):
    """The 18→64→64→4 reference MLP (no action history) compiles and matches, f32 and int8."""
    rng = np.random.default_rng(3)
    sizes = [18, 64, 64, 4]
    policy = DensePolicy(
        weights=tuple(
            (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
            for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        ),
        biases=tuple((0.1 * rng.standard_normal(b)).astype(np.float32) for b in sizes[1:]),
        activation="tanh",
        obs_mean=np.zeros(18, np.float32),
        obs_std=np.ones(18, np.float32),
        obs_clip=10.0,
        state_size=18,
        action_history=0,
        hover_action=0.0,
        metadata={},
    )
    obs = rng.standard_normal((200, 18)).astype(np.float32)
    exe = _build(tmp_path, policy)
    assert _self_test(exe) == 0
    assert np.abs(host_actions(exe, obs) - forward(policy, obs)).max() <= codegen.F32_TOLERANCE
    q = calibrate_int8(policy, obs)
    exe8 = _build(tmp_path, q)
    assert _self_test(exe8) == 0
    np.testing.assert_array_equal(
        host_actions(exe8, obs), int8_model.forward(int8_model.build(q), obs)
    )


def test_int8_weight_stream_decodes_to_the_dot_product():
    """The kernel's packed words (two outputs' int8 weights per int16 half): SMLAD of a word and
    of its SXTB16 with the input pairs gives back x·W + b exactly, extremes included."""
    rng = np.random.default_rng(5)
    n_in, n_out, rows = 13, 16, codegen.INT8_ROWS
    w = rng.integers(-127, 128, (n_in, n_out)).astype(np.int8)
    w[0], w[1] = -127, 127
    b = rng.integers(-50_000, 50_000, n_out).astype(np.int32)
    stream = codegen._int8_stream(int8_model.Layer(w, b, None, None), rows).astype(np.int64)
    x = rng.integers(-127, 128, (64, n_in + 1))
    x[:, n_in] = 0  # the odd input count's padding
    x[0] = 127

    def halves(v):  # uint32 -> (int16 low, int16 high)
        return ((v & 0xFFFF) ^ 0x8000) - 0x8000, ((v >> 16) ^ 0x8000) - 0x8000

    def sxtb16(v):  # bytes 0 and 2, sign-extended to 16 bits
        return ((v & 0xFF ^ 0x80) - 0x80) & 0xFFFF | (
            ((v >> 16 & 0xFF ^ 0x80) - 0x80) & 0xFFFF
        ) << 16

    pairs, out = rows // 2, np.zeros((len(x), n_out), np.int64)
    for blk, words in enumerate(stream):
        s, a = words[0:rows:2].copy(), words[1:rows:2].copy()
        s, a = s[None] + 0 * x[:, :1], a[None] + 0 * x[:, :1]
        for k in range(-(-n_in // 2)):
            wk = words[rows + pairs * k : rows + pairs * (k + 1)]
            lo, hi = halves(wk)
            slo, shi = halves(sxtb16(wk))
            s = s + lo * x[:, 2 * k, None] + hi * x[:, 2 * k + 1, None]
            a = a + slo * x[:, 2 * k, None] + shi * x[:, 2 * k + 1, None]
        a = ((a & 0xFFFFFFFF) ^ 2**31) - 2**31
        out[:, blk * rows : (blk + 1) * rows : 2] = a
        out[:, blk * rows + 1 : (blk + 1) * rows : 2] = ((s - a) & 0xFFFFFFFF ^ 2**31) - 2**31 >> 8
    np.testing.assert_array_equal(out, x[:, :n_in] @ w.astype(np.int64) + b)


def test_tanh_approximation_error():
    x = np.linspace(-12, 12, 4_000_001, dtype=np.float32)
    err = np.abs(activations.tanh_f32(x).astype(np.float64) - np.tanh(x.astype(np.float64)))
    assert err.max() <= activations.TANH_MAX_ERROR
    assert np.all(np.abs(activations.tanh_f32(x)) <= 1.0 + activations.TANH_MAX_ERROR)


def test_bad_input(hover_policy):
    with pytest.raises(RunError, match="activation 'silu'"):
        codegen.generate_c(dataclasses.replace(hover_policy, activation="silu"))
    with pytest.raises(RunError, match=r"example_inputs must be \[T, 18\]"):
        codegen.generate_c(hover_policy, example_inputs=np.zeros((3, 50), np.float32))
    with pytest.raises(RunError, match="finite"):
        codegen.generate_c(hover_policy, example_inputs=np.full((3, 18), np.nan, np.float32))
