"""Fly a run's policy on a real Crazyflie 2.x through cflib (the optional `crazyflie` extra).

The policy runs on board, in the out-of-tree controller app that
`firmware_export.crazyflie.write_app` generates; this module is the ground station:

1. connect (`cflib.crtp.init_drivers()` + `SyncCrazyflie`) and wait for the parameter values;
2. check the app's identity: its parameters `hoverfly.hashHi`/`hoverfly.hashLo` carry the run's
   16-hex-digit config hash (`hash_words`); refuse a Crazyflie without the app or with another
   run's policy, before anything is armed;
3. log the state estimate (`stateEstimate.x/y/z/vx/vy/vz/yaw`) and `hoverfly.active` at 50 Hz,
   arm (`cf.supervisor.send_arming_request`), set `hoverfly.enable` = 1 (acknowledged);
4. stream absolute position setpoints (`cf.commander.send_position_setpoint`) at `rate_hz`
   (≥ 10 Hz): they are the app's dead-man switch (its motors stop 200 ms after the last one). The
   plan (`flight_plan`): hold `height` m above the take-off point for `seconds`, then descend to
   5 cm above it over `land_seconds`;
5. always finish with `send_stop_setpoint`, `send_notify_setpoint_stop`, `hoverfly.enable` = 0 and
   a disarm request: after the plan, on Ctrl-C (SIGINT is caught during the flight, the motors are
   stopped, then KeyboardInterrupt is raised), on any exception, when the telemetry stops for
   `TELEMETRY_TIMEOUT_S`, when the estimate strays more than `max_error_m` from the path
   between the take-off point and the setpoint, or when the app reports that it is not driving
   the motors (`hoverfly.active` = 0 after `ACTIVE_TIMEOUT_S`).

Returns a flight summary (JSON-able dict).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from algos.run_folder import RunError, config_hash, read_config

APP_MANIFEST = "hoverfly_app.json"
ENABLE_PARAM = "hoverfly.enable"
HASH_PARAMS = ("hoverfly.hashHi", "hoverfly.hashLo")
POSITION_LOG = tuple(f"stateEstimate.{n}" for n in ("x", "y", "z", "vx", "vy", "vz"))
YAW_LOG = "stateEstimate.yaw"
ACTIVE_LOG = "hoverfly.active"
LOG_PERIOD_MS = 20
LAND_HEIGHT_M = 0.05
TELEMETRY_TIMEOUT_S = 0.5
ACTIVE_TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 10.0
PARAM_TIMEOUT_S = 10.0
ACK_TIMEOUT_S = 2.0


class CrazyflieError(RunError):
    """The Crazyflie path cannot go on (no cflib, no link, wrong app, no acknowledgement)."""


def hash_words(config_hash_hex: str) -> tuple[int, int]:
    """The app's (hashHi, hashLo) uint32 parameters for a 16-hex-digit config hash."""
    if len(config_hash_hex) != 16:
        raise CrazyflieError(f"config hash {config_hash_hex!r} is not 16 hex digits")
    return int(config_hash_hex[:8], 16), int(config_hash_hex[8:], 16)


def flight_plan(
    start: tuple[float, float, float, float],
    height: float,
    seconds: float,
    land_seconds: float,
    rate_hz: float,
) -> np.ndarray:
    """Setpoints [N, 4] (x m, y m, z m, yaw deg), one per 1/rate_hz s, from the take-off pose
    `start` (x, y, z, yaw): hold (x, y, z + height) for `seconds`, then descend linearly to
    z + LAND_HEIGHT_M over `land_seconds`."""
    x, y, z, yaw = start
    n_hover = max(1, round(seconds * rate_hz))
    n_land = max(1, round(land_seconds * rate_hz))
    frac = np.arange(1, n_land + 1) / n_land
    heights = np.concatenate([np.full(n_hover, height), height + (LAND_HEIGHT_M - height) * frac])
    plan = np.empty((len(heights), 4))
    plan[:, 0], plan[:, 1], plan[:, 2], plan[:, 3] = x, y, z + heights, yaw
    return plan


def _import_cflib():
    try:
        import cflib.crtp
        from cflib.crazyflie import Crazyflie
        from cflib.crazyflie.log import LogConfig
        from cflib.crazyflie.syncCrazyflie import SyncCrazyflie
    except ImportError:
        raise CrazyflieError("cflib is not installed: pip install hoverfly[crazyflie]") from None
    return cflib.crtp, Crazyflie, LogConfig, SyncCrazyflie


def _expected_hash(run_dir: Path, app_dir: Path | None) -> str:
    expected = config_hash(read_config(run_dir))
    if app_dir is not None:
        path = Path(app_dir) / APP_MANIFEST
        try:
            app_hash = json.loads(path.read_text())["config_hash"]
        except (OSError, ValueError, KeyError, TypeError):
            raise CrazyflieError(f"{path}: not a hoverfly app manifest") from None
        if app_hash != expected:
            raise CrazyflieError(
                f"app {app_dir} was generated from config {app_hash}, the run is {expected}"
            )
    return expected


def _open_link(scf, uri: str, timeout: float) -> None:
    """`scf.open_link()` (which waits without limit for the TOCs) bounded by `timeout`: past it,
    cflib's own connection-failed signal ends the wait."""
    errors: list[Exception] = []

    def target():
        try:
            scf.open_link()
        except Exception as e:  # cflib raises a bare Exception with the driver's message
            errors.append(e)

    thread = threading.Thread(target=target, name="hoverfly-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        scf.cf.connection_failed.call(uri, f"no answer within {timeout:g} s")
        thread.join(ACK_TIMEOUT_S)
    if errors or not scf.is_link_open():
        reason = " ".join(str(errors[0]).split()) if errors else "no answer"
        raise CrazyflieError(f"cannot connect to {uri}: {reason}")


def _wait_for_params(scf, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not scf.is_params_updated():
        if time.monotonic() > deadline:
            raise CrazyflieError(f"no parameter values from the Crazyflie within {timeout:g} s")
        time.sleep(0.01)


def check_app(cf, expected_hash: str) -> dict[str, Any]:
    """The app's identity from the Crazyflie's parameters; CrazyflieError unless it runs the app
    generated from the run whose config hash is `expected_hash`."""
    toc = cf.param.toc.toc
    names = (ENABLE_PARAM, *HASH_PARAMS)
    missing = [n for n in names if n.split(".")[1] not in toc.get("hoverfly", {})]
    if missing:
        raise CrazyflieError(
            f"the Crazyflie at {cf.link_uri} does not run a hoverfly app (no parameter "
            f"{missing[0]}): flash the app of this run first"
        )
    hi, lo = (int(cf.param.get_value(n)) for n in HASH_PARAMS)
    found = f"{hi:08x}{lo:08x}"
    if found != expected_hash:
        raise CrazyflieError(
            f"the Crazyflie runs the policy of config {found}, not this run's {expected_hash}"
        )
    return {"config_hash": found, "enable": int(cf.param.get_value(ENABLE_PARAM))}


class _Telemetry:
    """Two log blocks (a packet carries 26 bytes): position + velocity, and yaw (deg) + the app's
    `hoverfly.active`. `samples` rows: host time s, x, y, z (m), vx, vy, vz (m/s), active (the
    latest value), one per position packet."""

    def __init__(self, cf, log_config_cls):
        self._lock = threading.Lock()
        self._active = 0.0
        self._yaw: float | None = None
        self.samples: list[tuple[float, ...]] = []
        pos = log_config_cls(name="hoverfly_pos", period_in_ms=LOG_PERIOD_MS)
        att = log_config_cls(name="hoverfly_att", period_in_ms=LOG_PERIOD_MS)
        for name in POSITION_LOG:
            pos.add_variable(name, "float")
        att.add_variable(YAW_LOG, "float")
        att.add_variable(ACTIVE_LOG, "uint8_t")
        pos.data_received_cb.add_callback(self._on_position)
        att.data_received_cb.add_callback(self._on_attitude)
        self.configs = (pos, att)
        for conf in self.configs:
            try:
                cf.log.add_config(conf)
            except (KeyError, AttributeError) as e:
                raise CrazyflieError(f"cannot log the state estimate: {e}") from None
        for conf in self.configs:
            conf.start()

    def _on_position(self, timestamp, data, conf) -> None:
        row = (time.monotonic(), *(float(data[n]) for n in POSITION_LOG), self._active)
        with self._lock:
            self.samples.append(row)

    def _on_attitude(self, timestamp, data, conf) -> None:
        self._yaw = float(data[YAW_LOG])
        self._active = float(data[ACTIVE_LOG])

    def since(self, t: float) -> list[tuple[float, ...]]:
        with self._lock:
            return [r for r in self.samples if r[0] >= t]

    def latest(self) -> tuple[float, ...] | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    def start_pose(self, timeout: float) -> tuple[float, float, float, float]:
        """(x, y, z, yaw) of the first estimate logged by both blocks."""
        deadline = time.monotonic() + timeout
        while (row := self.latest()) is None or self._yaw is None:
            if time.monotonic() > deadline:
                raise CrazyflieError(f"no state estimate logged within {timeout:g} s")
            time.sleep(0.005)
        return row[1], row[2], row[3], self._yaw

    def stop(self) -> None:
        for conf in self.configs:
            with contextlib.suppress(Exception):
                conf.stop()


def _set_enable(cf, value: int, timeout: float) -> None:
    """Sets hoverfly.enable and waits until the Crazyflie echoes the new value."""
    done = threading.Event()

    def on_update(name, value_s):
        if int(value_s) == value:
            done.set()

    cf.param.add_update_callback(group="hoverfly", name="enable", cb=on_update)
    try:
        cf.param.set_value(ENABLE_PARAM, value)
        if not done.wait(timeout):
            raise CrazyflieError(f"{ENABLE_PARAM} = {value} not acknowledged within {timeout:g} s")
    finally:
        cf.param.remove_update_callback(group="hoverfly", name="enable", cb=on_update)


def _stop(cf) -> None:
    """Motors off by every route the firmware offers; each step is tried even if one fails."""
    steps = (
        cf.commander.send_stop_setpoint,
        cf.commander.send_notify_setpoint_stop,
        lambda: _set_enable(cf, 0, ACK_TIMEOUT_S),
        lambda: cf.supervisor.send_arming_request(False),
    )
    for step in steps:
        with contextlib.suppress(Exception):
            step()


class _SigintFlag:
    """Turns SIGINT into a flag during the flight (main thread only), so the loop can stop the
    motors before KeyboardInterrupt propagates."""

    def __init__(self):
        self.set = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        self.set = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _stream(
    cf,
    telemetry: _Telemetry,
    start: tuple[float, float, float],
    plan: np.ndarray,
    rate_hz: float,
    max_error_m: float,
    sigint: _SigintFlag,
    console: Console,
) -> tuple[str | None, int]:
    """Sends the plan's setpoints on schedule; returns (abort reason or None, setpoints sent).
    Aborts when the estimate is farther than `max_error_m` from the vertical path between the
    take-off point `start` and the current setpoint (where a climbing or landing drone is), and
    when the app's `hoverfly.active` log reads 0 after ACTIVE_TIMEOUT_S (the out-of-tree
    controller is not the one running, or it stopped: the stock controller must not fly)."""
    t0 = time.monotonic()
    with console.status("flying") as status:
        for k, (x, y, z, yaw) in enumerate(plan):
            if sigint.set:
                return "interrupted", k
            row = telemetry.latest()
            now = time.monotonic()
            if now - row[0] > TELEMETRY_TIMEOUT_S:
                return f"no state estimate for {now - row[0]:.2f} s", k
            if now - t0 > ACTIVE_TIMEOUT_S and not row[7]:
                return "the app is not driving the motors (hoverfly.active = 0)", k
            error = distance_to_path(row[1:4], start, (x, y, z))
            if error > max_error_m:
                return f"position error {error:.2f} m > {max_error_m:g} m", k
            cf.commander.send_position_setpoint(float(x), float(y), float(z), float(yaw))
            if k % max(1, round(rate_hz)) == 0:
                status.update(f"flying: {k / rate_hz:.1f} s, z = {row[3]:.2f} m → {z:.2f} m")
            time.sleep(max(0.0, t0 + (k + 1) / rate_hz - time.monotonic()))
    return None, len(plan)


def distance_to_path(p, start, setpoint) -> float:
    """Distance [m] from the point p to the segment start → setpoint (3-vectors, m)."""
    a, b, p = (np.asarray(v, float) for v in (start, setpoint, p))
    d = b - a
    s = np.clip(np.dot(p - a, d) / np.dot(d, d), 0.0, 1.0) if d.any() else 0.0
    return float(np.linalg.norm(p - (a + s * d)))


def _summary(
    samples: np.ndarray, plan: np.ndarray, n_hover: int, t_start: float, rate_hz: float
) -> dict[str, Any]:
    """Errors of the logged positions against the setpoint in force when each was logged."""
    if len(samples) == 0:
        return {"samples": 0}
    k = np.clip(((samples[:, 0] - t_start) * rate_hz).astype(int), 0, len(plan) - 1)
    err = np.linalg.norm(samples[:, 1:4] - plan[k, :3], axis=1)
    hover = k < n_hover
    return {
        "samples": int(len(samples)),
        "active_fraction": float(np.mean(samples[:, 7] > 0)),
        "pos_rmse_m": float(np.sqrt(np.mean(err[hover] ** 2))) if hover.any() else None,
        "max_pos_error_m": float(err.max()),
        "final_position": [float(v) for v in samples[-1, 1:4]],
    }


def fly(
    run_dir: Path,
    uri: str,
    app_dir: Path | None = None,
    seconds: float = 10.0,
    height: float = 0.5,
    dry_run: bool = False,
    console: Console | None = None,
    *,
    land_seconds: float = 2.0,
    rate_hz: float = 50.0,
    max_error_m: float = 0.8,
) -> dict[str, Any]:
    """Flies the policy of `run_dir` on the Crazyflie at `uri` (see the module docstring).

    dry_run: connect and check the app's identity only (nothing is armed or sent).
    Returns {uri, config_hash, dry_run, aborted, setpoints, setpoint_rate_hz, samples,
    active_fraction, pos_rmse_m (hover phase), max_pos_error_m, start, final_position}.
    """
    console = console or Console(stderr=True)
    if not (0.0 < height <= 2.0 and seconds > 0 and land_seconds > 0):
        raise CrazyflieError("need 0 < height ≤ 2 m, seconds > 0 and land_seconds > 0")
    if rate_hz < 10:
        raise CrazyflieError(f"setpoint rate {rate_hz:g} Hz < 10 Hz would trip the dead-man")
    expected = _expected_hash(Path(run_dir), app_dir)
    crtp, crazyflie_cls, log_config_cls, sync_cls = _import_cflib()
    crtp.init_drivers()
    summary: dict[str, Any] = {"uri": uri, "config_hash": expected, "dry_run": dry_run}
    scf = sync_cls(uri, cf=crazyflie_cls(rw_cache=None))
    _open_link(scf, uri, CONNECT_TIMEOUT_S)
    try:
        cf = scf.cf
        _wait_for_params(scf, PARAM_TIMEOUT_S)
        summary["app"] = check_app(cf, expected)
        console.print(f"{uri}: hoverfly app of config {expected}")
        if dry_run:
            return summary | {"aborted": None, "setpoints": 0}
        summary |= _flight(
            cf, log_config_cls, height, seconds, land_seconds, rate_hz, max_error_m, console
        )
    finally:
        scf.close_link()
    if summary["aborted"] == "interrupted":
        raise KeyboardInterrupt
    return summary


def _flight(
    cf, log_config_cls, height, seconds, land_seconds, rate_hz, max_error_m, console
) -> dict[str, Any]:
    telemetry = _Telemetry(cf, log_config_cls)
    try:
        start = telemetry.start_pose(ACK_TIMEOUT_S)
        plan = flight_plan(start, height, seconds, land_seconds, rate_hz)
        with _SigintFlag() as sigint:
            try:
                cf.supervisor.send_arming_request(True)
                _set_enable(cf, 1, ACK_TIMEOUT_S)
                t_start = time.monotonic()
                aborted, sent = _stream(
                    cf, telemetry, start[:3], plan, rate_hz, max_error_m, sigint, console
                )
                elapsed = time.monotonic() - t_start
            finally:
                _stop(cf)
        if aborted:
            console.print(f"[red]aborted: {aborted}; motors stopped")
        samples = np.asarray(telemetry.since(t_start), float)
        n_hover = max(1, round(seconds * rate_hz))
        return {
            "aborted": aborted,
            "setpoints": sent,
            "setpoint_rate_hz": sent / elapsed if elapsed > 0 else 0.0,
            "seconds": elapsed,
            "start": [float(v) for v in start[:3]],
            **_summary(samples.reshape(-1, 8), plan, n_hover, t_start, rate_hz),
        }
    finally:
        telemetry.stop()
