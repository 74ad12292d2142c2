"""Hardware-in-the-loop against the real target: the generated C policy + `firmware_export/hil`
cross-compiled for the STM32F405 and run in QEMU (`netduinoplus2`), over a pty or TCP link.

End to end: the shipped run flown in lock-step with the float32 firmware matches the JAX flight.
Target behaviour: failsafe on silence and on a stream of corrupt frames, rejection of corrupt and
replayed frames (the target survives and answers the next valid frame), clear errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import jax
import numpy as np
import pytest

from algos.run_folder import RunError, config_hash, load_run, read_config, write_config
from deploy import hil
from deploy import serial_protocol as sp
from deploy.policy import forward, record_rollouts
from deploy.quantize import calibrate_int8
from firmware_export.build import compile_elf, toolchain_available
from firmware_export.codegen import generate_c

pytestmark = pytest.mark.skipif(
    not toolchain_available(),
    reason="arm-none-eabi-gcc / qemu-system-arm missing "
    "(apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm)",
)

FAILSAFE_S = hil.FAILSAFE_FRAMES * hil.FRAME_PERIOD_MS / 1000


@pytest.fixture(scope="module")
def firmware_dir(hover_policy, tmp_path_factory):
    out = tmp_path_factory.mktemp("firmware_f32")
    for name, text in generate_c(hover_policy).items():
        (out / name).write_text(text)
    return out


@pytest.fixture(scope="module")
def elf(firmware_dir):
    return hil.build_hil_image(hil.read_firmware(firmware_dir))


@pytest.fixture
def link(elf):
    with hil.Target(elf, "pty") as target:
        link = hil.Link(target.port)
        link.ping()
        yield link


def state(i: float) -> list[float]:
    """A plausible state: small errors, identity attitude."""
    s = np.zeros(18, np.float32)
    s[:3] = 0.1 * np.sin([i, i + 1, i + 2])
    s[3:12] = np.eye(3).reshape(-1)
    return s.tolist()


def wait_for(link: hil.Link, msg_type: int, timeout: float) -> sp.Frame | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = link.receive(deadline - time.monotonic())
        if isinstance(event, sp.Frame) and event.msg_type == msg_type:
            return event
    return None


# -- end to end -------------------------------------------------------------------------------
def test_float32_firmware_flies_like_jax_over_pty(hover_run, firmware_dir):
    report = hil.run_hil(hover_run, firmware_dir, seconds=5.0, episodes=1, serial="pty")
    assert report["steps"] == 500 and report["precision"] == "f32"
    assert report["action_diff_max"] <= 1e-5  # the JAX policy on what the firmware saw
    assert report["deviation_max_m"] <= hil.DEVIATION_F32_M  # 1 cm over 5 s
    assert report["hil"]["termination_rate"] == report["jax"]["termination_rate"]
    assert abs(report["hil"]["pos_rmse_m"] - report["jax"]["pos_rmse_m"]) <= 0.01
    assert report["frames_failed"] <= 2  # under host load a cut frame is rejected and resent
    assert report["frames_sent"] >= report["steps"] * (1 - report["hil"]["termination_rate"])
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["max"]
    assert report["target"]["config_hash"] == config_hash(read_config(hover_run))
    json.dumps(report)  # for `hoverfly deploy hil --json`


def test_tcp_link(hover_run, firmware_dir):
    report = hil.run_hil(hover_run, firmware_dir, seconds=1.0, serial="tcp", seed=3)
    assert report["steps"] == 100 and report["serial"] == "tcp"
    assert report["deviation_max_m"] <= hil.DEVIATION_F32_M
    assert report["frames_failed"] <= 2  # under host load a cut frame is rejected and resent


def test_int8_firmware_within_documented_bound(hover_run, hover_policy, tmp_path):
    obs = record_rollouts(load_run(hover_run), 4, jax.random.key(1))["obs"]
    for name, text in generate_c(calibrate_int8(hover_policy, obs)).items():
        (tmp_path / name).write_text(text)
    report = hil.run_hil(hover_run, tmp_path, seconds=2.0, serial="pty")
    assert report["precision"] == "int8" and report["target"]["precision"] == 1
    assert 1e-4 < report["action_diff_max"] <= 0.5  # quantized, yet close
    assert report["deviation_max_m"] <= hil.DEVIATION_INT8_M
    assert report["hil"]["termination_rate"] == report["jax"]["termination_rate"]


# -- target behaviour -------------------------------------------------------------------------
def test_failsafe_when_the_host_goes_silent(link):
    link.reset()
    status = link.control(state(0))
    assert status.flags == sp.Flag.ARMED and max(status.action) > -1
    start = time.monotonic()
    frame = wait_for(link, sp.MsgType.FAILSAFE, FAILSAFE_S + 5)
    assert frame is not None, "no FAILSAFE frame"
    assert time.monotonic() - start >= 0.8 * FAILSAFE_S
    report = sp.decode_status(frame.payload)
    assert report.flags & sp.Flag.FAILSAFE and report.reason == sp.FailsafeReason.TIMEOUT
    assert report.action == (-1.0,) * 4  # zero thrust
    # Latched: observations get motors off until a RESET.
    assert link.control(state(1)).action == (-1.0,) * 4
    assert link.reset().flags == 0
    status = link.control(state(2))
    assert not status.flags & sp.Flag.FAILSAFE and max(status.action) > -1


def test_corrupt_frames_rejected_target_survives(link):
    link.reset()
    rx_errors = link.control(state(0)).rx_errors
    good = sp.encode_frame(sp.MsgType.OBS, 1000, sp.encode_obs(state(1)))
    flipped = bytearray(good)
    flipped[30] ^= 0x01
    link.seq = 1001
    junk = [
        bytes(flipped),  # bad CRC
        good[:50],  # truncated (completed by the next bytes: bad CRC)
        sp.SYNC + bytes([0x03, 0, 0, 0xFF, 0x7F]),  # oversize length
        sp.SYNC + bytes([0x42, 0, 0, 0, 0]) + b"\0\0",  # unknown type
        b"\x00\xff" * 20,  # noise without SYNC
        sp.encode_frame(sp.MsgType.ACTION, 1001, bytes(22)),  # a target→host type
    ]
    for chunk in junk:
        link.send_raw(chunk)
    link.seq = 1002
    status = link.control(state(1))
    assert not status.flags & sp.Flag.FAILSAFE and max(status.action) > -1
    assert status.rx_errors - rx_errors >= 4
    errors = [sp.decode_error(e.payload) for e in link.events if e.msg_type == sp.MsgType.ERROR]
    codes = {e.code for e in errors}
    assert {sp.ErrorCode.BAD_CRC, sp.ErrorCode.OVERSIZE, sp.ErrorCode.UNKNOWN_TYPE} <= codes
    assert sp.ErrorCode.UNEXPECTED in codes


def test_failsafe_after_n_consecutive_bad_frames(firmware_dir, tmp_path):
    # Its own image: N = 8 frames of 2 s, so that the silence timeout (16 s of emulated time) cannot
    # fire first while QEMU works through the bad frames on a busy host.
    n = 8
    firmware = hil.read_firmware(firmware_dir)
    elf = hil.build_hil_image(firmware, tmp_path, failsafe_frames=n, frame_period_ms=2000)
    bad = bytearray(sp.encode_frame(sp.MsgType.OBS, 0, sp.encode_obs(state(1))))
    bad[-1] ^= 0xFF
    with hil.Target(elf, "pty") as target:
        link = hil.Link(target.port)
        assert link.ping().failsafe_frames == n
        link.reset()
        link.control(state(0))
        for _ in range(n - 1):
            link.send_raw(bytes(bad))
        assert not link.control(state(2)).flags & sp.Flag.FAILSAFE  # a valid frame ends the streak
        for _ in range(n):
            link.send_raw(bytes(bad))
        frame = wait_for(link, sp.MsgType.FAILSAFE, 10.0)
    assert frame is not None
    assert sp.decode_status(frame.payload).reason == sp.FailsafeReason.BAD_FRAMES


def test_replayed_frame_rejected_and_policy_not_run_twice(link, hover_policy):
    link.reset()
    replay = sp.encode_frame(sp.MsgType.OBS, 500, sp.encode_obs(state(0)))
    link.seq = 501
    link.send_raw(replay)
    first = link.receive(2.0)
    assert isinstance(first, sp.Frame) and first.msg_type == sp.MsgType.ACTION
    a0 = np.asarray(sp.decode_status(first.payload).action, np.float32)
    link.send_raw(replay)
    error = wait_for(link, sp.MsgType.ERROR, 2.0)
    assert error is not None
    assert sp.decode_error(error.payload) == sp.ErrorReport(500, sp.ErrorCode.STALE_SEQ, 0x03)
    a1 = np.asarray(link.control(state(1)).action, np.float32)
    # The history holds a0 once: the replay did not run policy_control again.
    history = np.full(4 * hover_policy.action_history, hover_policy.hover_action, np.float32)
    history[4:], history[:4] = history[:-4].copy(), a0
    expected = forward(hover_policy, np.concatenate([np.asarray(state(1), np.float32), history]))
    np.testing.assert_allclose(a1, expected, atol=1e-4)


# -- errors -----------------------------------------------------------------------------------
def test_missing_firmware_dir(hover_run, tmp_path):
    with pytest.raises(hil.HilError, match="does not exist"):
        hil.run_hil(hover_run, tmp_path / "nope")
    with pytest.raises(hil.HilError, match="no policy.h"):
        hil.run_hil(hover_run, tmp_path)


def test_firmware_report_is_read(firmware_dir, tmp_path):
    shutil.copytree(firmware_dir, tmp_path / "fw")
    report = tmp_path / "fw" / "firmware.json"
    report.write_text('{"precision": "int8", "config_hash": "0123456789abcdef"}')
    want = hil.Firmware(tmp_path / "fw", "int8", "0123456789abcdef")
    assert hil.read_firmware(tmp_path / "fw") == want
    report.write_text('{"precision": "fp4"}')
    with pytest.raises(hil.HilError, match="unknown precision 'fp4'"):
        hil.read_firmware(tmp_path / "fw")
    report.write_text('{"precision": "f32", "config_hash": "\\"; rm"}')
    with pytest.raises(hil.HilError, match="not 16 hex digits"):
        hil.read_firmware(tmp_path / "fw")


def test_export_of_another_run(hover_run, firmware_dir, tmp_path):
    other = tmp_path / "run"
    shutil.copytree(hover_run, other)
    cfg = read_config(other)
    write_config(other, dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, seed=7)))
    with pytest.raises(hil.HilError, match="built for config"):
        hil.run_hil(other, firmware_dir, seconds=0.1)


def test_target_built_for_another_config(hover_run, firmware_dir, tmp_path):
    fw = dataclasses.replace(hil.read_firmware(firmware_dir), config_hash="0123456789abcdef")
    with hil.Target(hil.build_hil_image(fw, out_dir=tmp_path)) as target:
        pong = hil.Link(target.port).ping()
    with pytest.raises(hil.HilError, match="built for config 0123456789abcdef"):
        hil.check_target(pong, read_config(hover_run), hover_run, fw)


def test_silent_target(tmp_path):
    src = tmp_path / "idle.c"
    src.write_text("int main(void) {\n  for (;;) {\n  }\n}\n")
    elf = compile_elf([src], tmp_path / "idle.elf")
    with hil.Target(elf, "pty") as target, pytest.raises(hil.HilError, match="did not answer PING"):
        hil.Link(target.port).ping(timeout=1.0)
    assert target.proc.poll() is not None  # QEMU is gone
    with pytest.raises(KeyboardInterrupt), hil.Target(elf, "tcp") as target:
        raise KeyboardInterrupt
    assert target.proc.poll() is not None


def test_missing_toolchain_named(hover_run, firmware_dir, tmp_path, monkeypatch):
    fresh = tmp_path / "fw"
    shutil.copytree(firmware_dir, fresh, ignore=shutil.ignore_patterns("hil.*"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RunError, match="gcc-arm-none-eabi"):
        hil.run_hil(hover_run, fresh, seconds=0.1)
