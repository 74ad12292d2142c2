"""The generated Crazyflie app (firmware_export.crazyflie.write_app) and its own C.

The firmware cannot be built here (it needs its git submodules), so the app's C is compiled on the
host against `crazyflie_host/crazyflie_api.h` (the firmware's public struct layouts and calls) with
`crazyflie_host/test_driver.c`, which plays the 1 kHz stabilizer loop tick by tick, records every
`motorsSetRatio` and, through `--wrap`, every call into the generated policy. The recorded states
are checked against `sim`'s rotation matrix and the conversions, the actions against
`deploy.policy.forward` on the same observation (history included), the motor writes against the
rpm mapping. The same C is then compiled for the Cortex-M4F with warnings as errors.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from algos.run_folder import RunError
from deploy.crazyflie import APP_MANIFEST, hash_words
from deploy.policy import forward
from deploy.quantize import calibrate_int8
from firmware_export import int8_model
from firmware_export.codegen import F32_TOLERANCE, INT8_TOLERANCE, generate_c
from firmware_export.crazyflie import write_app
from firmware_export.crazyflie.app import DEADMAN_MS
from sim.quadrotor.dynamics import rotation_matrix

HOST = Path(__file__).with_name("crazyflie_host")
WRAPS = "-Wl,--wrap=policy_evaluate,--wrap=policy_push_action,--wrap=policy_reset"
ARM_FLAGS = ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16")
STABILIZER_STACK_BUDGET = 1024
"""Bytes the app may take on the stabilizer task's stack: the firmware gives that task
3 × FREERTOS_MIN_STACK_SIZE (150) words = 1800 bytes (src/config/config.h), shared with the loop."""
MODE_ABS, MODE_DISABLE, CONTROL_MODE_FORCE = 1, 0, 2


# -- building and driving the app -------------------------------------------------------------
def compile_driver(app: Path, exe: Path) -> Path:
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler (gcc)")
    src = app / "src"
    cmd = [cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{src}", f"-I{HOST}"]
    cmd += [str(src / "hoverfly_controller.c"), str(src / "policy.c"), str(HOST / "test_driver.c")]
    proc = subprocess.run([*cmd, "-lm", WRAPS, "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return exe


@dataclass
class Ticks:
    """A stabilizer scenario: one row per tick (see test_driver.c for the meaning)."""

    step: np.ndarray
    now: np.ndarray
    sp_ts: np.ndarray
    pos: np.ndarray
    quat_wxyz: np.ndarray
    vel: np.ndarray
    gyro_deg: np.ndarray
    sp_pos: np.ndarray
    sp_vel: np.ndarray
    enable: np.ndarray
    allowed: np.ndarray
    mode: np.ndarray

    def lines(self) -> str:
        f32 = lambda a: [repr(float(v)) for v in np.asarray(a, np.float32)]  # noqa: E731
        quat_xyzw = self.quat_wxyz[:, [1, 2, 3, 0]]
        rows = []
        for i in range(len(self.step)):
            ints = [self.step[i], self.now[i], self.enable[i], self.allowed[i], self.sp_ts[i]]
            ints = [str(int(v)) for v in [*ints, *self.mode[i]]]
            floats = np.concatenate(
                [self.sp_pos[i], self.sp_vel[i], self.pos[i], quat_xyzw[i], self.vel[i]]
            )
            rows.append(" ".join(ints + f32(floats) + f32(self.gyro_deg[i])))
        return "\n".join(rows) + "\n"


def random_ticks(rng, n: int, step0: int = 1, now0: int = 1000, spread: float = 1.0) -> Ticks:
    """n consecutive ticks with a fresh absolute position setpoint each; `spread` scales the
    random state (1: up to beyond the position and velocity clips)."""
    q = rng.normal(size=(n, 4))
    step = np.arange(step0, step0 + n)
    now = np.arange(now0, now0 + n)
    return Ticks(
        step=step,
        now=now,
        sp_ts=now.copy(),
        pos=rng.uniform(-1, 1, (n, 3)) * spread + [0, 0, 0.5],
        quat_wxyz=q / np.linalg.norm(q, axis=1, keepdims=True),
        vel=rng.uniform(-4, 4, (n, 3)) * spread,
        gyro_deg=rng.uniform(-500, 500, (n, 3)) * spread,
        sp_pos=np.tile([0.1, -0.2, 0.5], (n, 1)),
        sp_vel=np.zeros((n, 3)),
        enable=np.ones(n, int),
        allowed=np.ones(n, int),
        mode=np.full((n, 3), MODE_ABS),
    )


@dataclass
class Records:
    self_test: int = -1
    params: dict = field(default_factory=dict)
    logs: dict = field(default_factory=dict)
    evals: list = field(default_factory=list)  # (step, state [18], action [4])
    pushes: list = field(default_factory=list)  # (step, action [4])
    resets: list = field(default_factory=list)
    motors: dict = field(default_factory=dict)  # step -> [(id, ratio)]
    control: dict = field(default_factory=dict)  # step -> (mode, forces [4])

    def eval_steps(self) -> np.ndarray:
        return np.array([s for s, _, _ in self.evals])


def run_driver(exe: Path, ticks: Ticks | None = None) -> Records:
    text = ticks.lines() if ticks is not None else ""
    proc = subprocess.run([str(exe)], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rec = Records()
    for line in proc.stdout.splitlines():
        kind, *rest = line.split()
        if kind == "T":
            rec.self_test = int(rest[0])
        elif kind == "PARAM":
            rec.params[rest[0]] = (int(rest[1]), int(rest[2]))
        elif kind == "LOG":
            rec.logs[rest[0]] = int(rest[1])
        elif kind == "E":
            v = np.array(rest[1:], np.float32)
            rec.evals.append((int(rest[0]), v[:18], v[18:]))
        elif kind == "P":
            rec.pushes.append((int(rest[0]), np.array(rest[1:], np.float32)))
        elif kind == "R":
            rec.resets.append(int(rest[0]))
        elif kind == "M":
            rec.motors.setdefault(int(rest[0]), []).append((int(rest[1]), int(rest[2])))
        elif kind == "C":
            rec.control[int(rest[0])] = (int(rest[1]), np.array(rest[2:], np.float32))
    return rec


# -- Python references ------------------------------------------------------------------------
def reference_state(t: Ticks, clip_p: float = 0.5, clip_v: float = 2.0) -> np.ndarray:
    """The 18 state values [N, 18] the app must build (sim's R(q), w-first)."""
    rot = np.stack(rotation_matrix(tuple(t.quat_wxyz.T)), axis=1)
    return np.concatenate(
        [
            np.clip(t.pos - t.sp_pos, -clip_p, clip_p),
            rot,
            np.clip(t.vel - t.sp_vel, -clip_v, clip_v),
            np.deg2rad(t.gyro_deg),
        ],
        axis=1,
    )


def motor_ratios(action: np.ndarray, rpm_max: float) -> list[int]:
    """(uint16)(rpm / rpm_max · 65535) with rpm = rpm_max (a + 1) / 2, in float32 like the app."""
    rpm_max = np.float32(rpm_max)
    rpm = rpm_max * (np.float32(action) + np.float32(1)) * np.float32(0.5)
    ratio = np.clip(rpm / rpm_max, np.float32(0), np.float32(1))
    return [int(r * np.float32(65535)) for r in ratio]


def replay_reference(policy, rec: Records, forward_fn) -> tuple[np.ndarray, np.ndarray]:
    """(C actions, reference actions) [E, 4]: each evaluation's observation is its recorded
    state plus the history the app must hold: hover action after every reset (R) up to that
    tick, then each pushed action (P), newest first."""
    hover = np.full(4 * policy.action_history, policy.hover_action, np.float32)
    history, last_step = hover, -1
    pushes = dict(rec.pushes)
    c_actions, ref_actions = [], []
    for step, state, action in rec.evals:
        if any(last_step < r <= step for r in rec.resets):
            history = hover
        c_actions.append(action)
        ref_actions.append(forward_fn(np.concatenate([state, history])[None])[0])
        if step in pushes:
            history = np.concatenate([np.clip(pushes[step], -1, 1), history[:-4]])
        last_step = step
    return np.array(c_actions), np.array(ref_actions)


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app(hover_run, tmp_path_factory) -> Path:
    """The f32 app of the shipped run, from its run folder (what the CLI passes)."""
    out = tmp_path_factory.mktemp("crazyflie") / "app"
    write_app(str(hover_run), out)
    return out


@pytest.fixture(scope="module")
def driver(app, tmp_path_factory) -> Path:
    return compile_driver(app, tmp_path_factory.mktemp("driver") / "driver")


@pytest.fixture(scope="module")
def int8_policy(hover_policy):
    """An int8 policy calibrated on observations like the ones the tests drive it with: states of
    random scenarios, action histories around the hover action."""
    rng = np.random.default_rng(11)
    states = reference_state(random_ticks(rng, 2000, spread=0.2))
    history = hover_policy.hover_action + 0.1 * rng.standard_normal((2000, 32))
    return calibrate_int8(hover_policy, np.concatenate([states, history], 1).astype(np.float32))


@pytest.fixture(scope="module")
def int8_app(int8_policy, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("crazyflie_int8") / "app"
    write_app(int8_policy, out, precision="int8")
    return out


# -- the generated folder ---------------------------------------------------------------------
def test_app_folder_is_a_firmware_oot_build(app, hover_policy):
    config_hash = hover_policy.metadata["config_hash"]
    makefile = (app / "Makefile").read_text()
    assert "CRAZYFLIE_BASE ?= ../crazyflie-firmware" in makefile
    assert "OOT_CONFIG := $(PWD)/app-config" in makefile
    assert "include $(CRAZYFLIE_BASE)/tools/make/oot.mk" in makefile
    assert (app / "Kbuild").read_text().split() == ["obj-y", "+=", "src/"]
    config = (app / "app-config").read_text().splitlines()
    for line in ("CONFIG_APP_ENABLE=y", "CONFIG_APP_PRIORITY=1", "CONFIG_APP_STACKSIZE=350"):
        assert line in config
    assert "CONFIG_CONTROLLER_OOT=y" in config
    assert "# CONFIG_ENABLE_THRUST_BAT_COMPENSATED is not set" in config
    kbuild = (app / "src" / "Kbuild").read_text()
    assert "obj-y += hoverfly_controller.o" in kbuild and "obj-y += policy.o" in kbuild
    # policy.c/.h: the codegen's output for the run's policy, self-contained (no firmware header).
    assert (app / "src" / "policy.c").read_text() == generate_c(hover_policy)["policy.c"]
    for name in ("policy.h", "policy.c"):
        includes = re.findall(r'#include [<"]([^>"]+)[>"]', (app / "src" / name).read_text())
        assert set(includes) <= {"policy.h", "math.h", "stdint.h", "string.h", "arm_acle.h"}
    header = (app / "src" / "hoverfly_config.h").read_text()
    hi, lo = hash_words(config_hash)
    assert f'#define HOVERFLY_CONFIG_HASH "{config_hash}"' in header
    assert f"0x{hi:08X}u" in header and f"0x{lo:08X}u" in header
    rpm_max = hover_policy.metadata["action"]["rpm_max"]
    assert f"#define HOVERFLY_RPM_MAX {float(np.float32(rpm_max))!r}f" in header
    readme = (app / "README.md").read_text()
    assert config_hash in readme and "$" not in readme.replace("$(", "")
    manifest = json.loads((app / APP_MANIFEST).read_text())
    assert manifest["config_hash"] == config_hash and manifest["precision"] == "f32"
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((app / name).read_bytes()).hexdigest() == digest


def test_write_app_replaces_apps_and_refuses_other_folders(hover_policy, tmp_path):
    out = tmp_path / "app"
    write_app(hover_policy, out)
    (out / "stale.txt").write_text("left from an earlier export")
    result = write_app(hover_policy, out)
    assert not (out / "stale.txt").exists() and result["files"] == sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not a hoverfly app folder"):
        write_app(hover_policy, other)
    with pytest.raises(RunError, match="int8 needs the run folder"):
        write_app(hover_policy, tmp_path / "q", precision="int8")
    with pytest.raises(RunError, match="precision must be"):
        write_app(hover_policy, tmp_path / "q", precision="f16")
    assert (other / "notes.txt").read_text() == "mine" and not (tmp_path / "q").exists()


# -- the app's C on the host ------------------------------------------------------------------
def test_boot_self_test_parameters_and_logs(driver, hover_policy):
    rec = run_driver(driver)
    assert rec.self_test == 1  # controllerOutOfTreeTest() ran policy_test() without failures
    hi, lo = hash_words(hover_policy.metadata["config_hash"])
    param_uint8, param_uint32_ronly = 0x08, 0x0A | 0x40
    assert rec.params == {
        "enable": (param_uint8, 0),
        "hashHi": (param_uint32_ronly, hi),
        "hashLo": (param_uint32_ronly, lo),
    }
    log_uint8, log_float = 1, 7
    assert rec.logs == {"active": log_uint8} | {f"a{i}": log_float for i in range(1, 5)}


def test_state_conversion(driver):
    """Random attitudes, positions and velocities beyond the clips, fast gyro rates."""
    rng = np.random.default_rng(0)
    ticks = random_ticks(rng, 300)
    ticks.step = 2 * np.arange(1, 301)  # every tick an evaluation tick
    rec = run_driver(driver, ticks)
    assert len(rec.evals) == 300
    states = np.array([s for _, s, _ in rec.evals])
    ref = reference_state(ticks)
    np.testing.assert_allclose(states[:, 0:3], ref[:, 0:3], atol=1e-6)  # position error, clipped
    np.testing.assert_allclose(states[:, 3:12], ref[:, 3:12], atol=2e-6)  # R(q), body→world
    np.testing.assert_allclose(states[:, 12:15], ref[:, 12:15], atol=1e-6)  # velocity, clipped
    np.testing.assert_allclose(states[:, 15:18], ref[:, 15:18], rtol=1e-6)  # deg/s → rad/s
    assert np.abs(states[:, 0:3]).max() == pytest.approx(0.5)
    assert np.abs(states[:, 12:15]).max() == pytest.approx(2.0)


def test_500hz_policy_100hz_history_match_the_reference(driver, hover_policy):
    rng = np.random.default_rng(1)
    ticks = random_ticks(rng, 1000, spread=0.2)
    rec = run_driver(driver, ticks)
    steps = rec.eval_steps()
    np.testing.assert_array_equal(steps, np.arange(2, 1001, 2))  # 500 evaluations
    push_steps = [s for s, _ in rec.pushes]
    assert push_steps == list(range(10, 1001, 10))  # 100 history updates
    evals = {s: a for s, _, a in rec.evals}
    for s, pushed in rec.pushes:
        np.testing.assert_array_equal(pushed, evals[s])
    assert rec.resets == [1]  # the policy resumed on the first tick
    c_actions, ref = replay_reference(hover_policy, rec, lambda o: forward(hover_policy, o))
    np.testing.assert_allclose(c_actions, ref, atol=F32_TOLERANCE)
    assert np.std(ref[:, 0]) > 0.01  # the scenario exercises the policy
    # Motors: written on evaluation ticks only, M1..M4 in action order, ratio of the rpm.
    rpm_max = hover_policy.metadata["action"]["rpm_max"]
    assert sorted(rec.motors) == list(steps)
    for s, _, action in rec.evals:
        ids, ratios = zip(*rec.motors[s], strict=True)
        assert ids == (0, 1, 2, 3)
        assert np.abs(np.array(ratios) - motor_ratios(action, rpm_max)).max() <= 1
    # control mirrors the ratios as normalized forces, held between evaluations.
    for step in ticks.step[1:]:
        mode, forces = rec.control[int(step)]
        last = [ratio for _, ratio in rec.motors[int(step - step % 2)]]
        assert mode == CONTROL_MODE_FORCE
        np.testing.assert_array_equal((forces * np.float32(65535)).astype(int), last)


def test_deadman_stops_the_motors_and_recovery_resets_the_history(driver, hover_policy):
    rng = np.random.default_rng(2)
    ticks = random_ticks(rng, 400, step0=0, spread=0.2)  # step i at now = 1000 + i
    ticks.sp_ts[:300] = ticks.now[0]  # setpoints stop after the first tick ...
    rec = run_driver(driver, ticks)  # ... and resume (fresh each tick) from tick 300 on
    age = ticks.now - ticks.sp_ts
    flying = age <= DEADMAN_MS
    np.testing.assert_array_equal(rec.eval_steps(), ticks.step[flying & (ticks.step % 2 == 0)])
    assert DEADMAN_MS in rec.eval_steps()  # still flying on the last tick of the window
    for step in ticks.step[~flying]:
        assert rec.motors[step] == [(0, 0), (1, 0), (2, 0), (3, 0)]
        assert not rec.control[step][1].any()
    assert ticks.step[~flying][0] == DEADMAN_MS + 1
    assert rec.resets == [0, 300]
    c_actions, ref = replay_reference(hover_policy, rec, lambda o: forward(hover_policy, o))
    np.testing.assert_allclose(c_actions, ref, atol=F32_TOLERANCE)


def test_motors_off_unless_enabled_allowed_and_given_a_position_setpoint(driver):
    rng = np.random.default_rng(3)
    ticks = random_ticks(rng, 100, spread=0.2)
    ticks.enable[20:30] = 0  # hoverfly.enable cleared
    ticks.allowed[40:50] = 0  # supervisor: not armed / crashed / emergency stop
    ticks.mode[60:70, 2] = MODE_DISABLE  # a stop setpoint (z not absolute)
    rec = run_driver(driver, ticks)
    off = (ticks.enable == 0) | (ticks.allowed == 0) | (ticks.mode[:, 2] != MODE_ABS)
    for step in ticks.step[off]:
        assert rec.motors[step] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert not set(rec.eval_steps()) & set(ticks.step[off])
    assert rec.resets == [1, 31, 51, 71]


# -- int8 -------------------------------------------------------------------------------------
def test_int8_app_matches_the_integer_model_and_tracks_the_float_policy(
    int8_app, int8_policy, hover_policy, tmp_path
):
    exe = compile_driver(int8_app, tmp_path / "driver")
    rng = np.random.default_rng(4)
    rec = run_driver(exe, random_ticks(rng, 200, spread=0.2))
    assert rec.self_test == 1 and len(rec.evals) == 100
    model = int8_model.build(int8_policy)
    c_actions, ref = replay_reference(hover_policy, rec, lambda o: int8_model.forward(model, o))
    np.testing.assert_allclose(c_actions, ref, atol=INT8_TOLERANCE)
    _, ref_f32 = replay_reference(hover_policy, rec, lambda o: forward(hover_policy, o))
    error = np.abs(c_actions - ref_f32)
    assert error.max() < 0.1 and error.mean() < 0.02


# -- Cortex-M4F ---------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["app", "int8_app"])
def test_cortex_m4_build_warning_free_within_the_stabilizer_stack(which, request, tmp_path):
    cc = shutil.which("arm-none-eabi-gcc")
    if cc is None:
        pytest.skip("arm-none-eabi-gcc not installed")
    src = request.getfixturevalue(which) / "src"
    frames = {}
    for name in ("hoverfly_controller.c", "policy.c"):
        obj = tmp_path / name.replace(".c", ".o")
        cmd = [cc, *ARM_FLAGS, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"]
        cmd += ["-Wdouble-promotion", "-fstack-usage", f"-I{src}", f"-I{HOST}"]
        proc = subprocess.run([*cmd, "-c", str(src / name), "-o", str(obj)], capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()
        for line in obj.with_suffix(".su").read_text().splitlines():
            function, size, _ = line.rsplit("\t", 2)
            frames[function.rsplit(":", 1)[1]] = int(size)
    used = frames["controllerOutOfTree"] + frames["policy_evaluate"]
    assert used <= STABILIZER_STACK_BUDGET, frames
