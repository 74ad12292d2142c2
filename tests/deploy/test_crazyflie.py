"""deploy.crazyflie against cflib's real UDP link and a loopback Crazyflie.

`FakeCrazyflie` is a UDP endpoint speaking CRTP the way the firmware answers cflib's connection
sequence (link-service source string, protocol version 12, log/param TOCs v2, memory count,
parameter reads and writes, log blocks, supervisor arming, echo), with a point-mass "drone" that
follows the position setpoints while hoverfly.enable is set. It records every datagram cflib's
`udp://` driver sends, so the tests check the bytes that would go over the radio; the expected
commander packets come from cflib's own `Commander` encoding the flight plan.
"""

from __future__ import annotations

import _thread
import json
import socket
import struct
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from algos.run_folder import config_hash, read_config
from deploy import crazyflie
from deploy.crazyflie import (
    APP_MANIFEST,
    CrazyflieError,
    distance_to_path,
    flight_plan,
    fly,
    hash_words,
)

pytest.importorskip("cflib")
from cflib.crazyflie.commander import Commander  # noqa: E402

PARAM_UINT8, PARAM_UINT32_RO = 0x08, 0x0A | 0x40
LOG_UINT8, LOG_FLOAT = 0x01, 0x07
PROTOCOL_VERSION = 12
START = (0.25, -0.5, 0.0, 30.0)  # x, y, z, yaw of the fake drone at take-off (float32-exact)
PORT_PARAM, PORT_COMMANDER, PORT_MEM, PORT_LOG, PORT_GENERIC = 2, 3, 4, 5, 7
PORT_SUPERVISOR, PORT_PLATFORM, PORT_LINK = 9, 13, 15


def header(port: int, channel: int) -> int:
    return (port << 4) | (3 << 2) | channel


class FakeCrazyflie:
    """A loopback Crazyflie (see the module docstring). `hook(fake, packet)` runs on every
    received datagram; `received` holds (arrival time, bytes) of each."""

    def __init__(self, params: dict[str, tuple[int, int]], hook=None):
        self.params = list(params.items())
        self.log_toc = [(f"stateEstimate.{n}", LOG_FLOAT) for n in "x y z vx vy vz".split()]
        self.log_toc += [(f"stateEstimate.{n}", LOG_FLOAT) for n in ("roll", "pitch", "yaw")]
        self.log_toc += [("hoverfly.active", LOG_UINT8)]
        x, y, z, yaw = START
        self.values = {"stateEstimate.x": x, "stateEstimate.y": y, "stateEstimate.z": z}
        self.values |= {"stateEstimate.yaw": yaw, "hoverfly.active": 0}
        self.hook = hook
        self.streaming = True
        self.follow = True
        self.app_runs = True
        self.received: list[tuple[float, bytes]] = []
        self._blocks: dict[int, list[tuple[str, int]]] = {}
        self._started: dict[int, list[float]] = {}  # id -> [period s, next due time]
        self._last_setpoint = -1.0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.005)
        self._peer = None
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        return f"udp://127.0.0.1:{self._sock.getsockname()[1]}"

    def param(self, name: str) -> int:
        return dict(self.params).get(name, (0, 0))[1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()
        if self.error:
            raise self.error

    def packets(self, port: int, channel: int) -> list[tuple[float, bytes]]:
        return [(t, p) for t, p in self.received if p[0] == header(port, channel)]

    def _send(self, port: int, channel: int, data: bytes) -> None:
        self._sock.sendto(bytes([header(port, channel)]) + data, self._peer)

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as e:  # surfaced by close()
            self.error = e

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, self._peer = self._sock.recvfrom(64)
            except TimeoutError:
                packet = None
            if packet:
                with self._lock:
                    self.received.append((time.monotonic(), packet))
                    self._handle(packet[0] >> 4, packet[0] & 3, packet[1:])
                if self.hook:
                    self.hook(self, packet)
            self._stream_logs()

    def _handle(self, port: int, channel: int, data: bytes) -> None:
        if port == PORT_LINK:
            self._send(port, channel, b"Bitcraze Crazyflie" if channel == 1 else data)
        elif port == PORT_PLATFORM and channel == 1 and data[0] == 0:
            self._send(port, channel, bytes([0, PROTOCOL_VERSION]))
        elif port == PORT_MEM and channel == 0 and data[0] == 1:
            self._send(port, channel, bytes([1, 0]))
        elif port in (PORT_LOG, PORT_PARAM) and channel == 0:
            self._toc(port, data)
        elif port == PORT_PARAM:
            self._param(channel, data)
        elif port == PORT_LOG and channel == 1:
            self._log_settings(data)
        elif port == PORT_SUPERVISOR and channel == 1 and data[0] == 1:
            self._send(port, channel, bytes([0x81, 1, data[1]]))
        elif port == PORT_GENERIC and channel == 0 and data[0] == 7:
            self._last_setpoint = time.monotonic()
            self._follow(struct.unpack("<4f", data[1:17]))

    def _toc(self, port: int, data: bytes) -> None:
        toc = self.log_toc if port == PORT_LOG else [(n, t) for n, (t, _) in self.params]
        if data[0] == 3:  # TOC info v2: count, CRC
            self._send(port, 0, bytes([3]) + struct.pack("<HI", len(toc), 0x5EED))
        elif data[0] == 2:  # TOC item v2
            index = struct.unpack("<H", data[1:3])[0]
            name, kind = toc[index]
            group, var = name.split(".")
            item = bytes([kind]) + f"{group}\0{var}\0".encode()
            self._send(port, 0, bytes([2]) + struct.pack("<H", index) + item)

    def _param(self, channel: int, data: bytes) -> None:
        index = struct.unpack("<H", data[:2])[0]
        name, (kind, value) = self.params[index]
        fmt = "<B" if kind & 0x0F == PARAM_UINT8 else "<I"
        if channel == 1:  # read: id, status, value
            self._send(PORT_PARAM, 1, data[:2] + bytes([0]) + struct.pack(fmt, value))
        elif channel == 2:  # write: store, echo id and value
            value = struct.unpack(fmt, data[2:])[0]
            self.params[index] = (name, (kind, value))
            self._send(PORT_PARAM, 2, data[:2] + struct.pack(fmt, value))

    def _log_settings(self, data: bytes) -> None:
        cmd, block = data[0], (data[1] if len(data) > 1 else 0)
        if cmd == 6:  # create block v2: (fetch type, TOC id) per variable
            items = data[2:]
            self._blocks[block] = [
                (self.log_toc[struct.unpack("<H", items[i + 1 : i + 3])[0]][0], items[i] & 0x0F)
                for i in range(0, len(items), 3)
            ]
        elif cmd == 3:
            self._started[block] = [data[2] * 0.01, time.monotonic()]
        elif cmd in (2, 4):
            self._started.pop(block, None)
        self._send(PORT_LOG, 1, bytes([cmd, block, 0]))

    def _follow(self, setpoint) -> None:
        """The point-mass drone: moves a fifth of the way to each setpoint while enabled."""
        if self.follow and self.param("hoverfly.enable"):
            for axis, target in zip("xyz", setpoint[:3], strict=True):
                key = f"stateEstimate.{axis}"
                self.values[key] += 0.2 * (target - self.values[key])

    def _stream_logs(self) -> None:
        now = time.monotonic()
        with self._lock:
            enabled = self.param("hoverfly.enable")
            fresh = now - self._last_setpoint < 0.2
            self.values["hoverfly.active"] = int(self.app_runs and enabled and fresh)
            for block, due in self._started.items():
                if now < due[1] or not self.streaming:
                    continue
                due[1] = now + due[0]
                ms = int(now * 1000) & 0xFFFFFF
                data = bytes([block]) + ms.to_bytes(3, "little")
                for name, kind in self._blocks[block]:
                    fmt = "<f" if kind == LOG_FLOAT else "<B"
                    data += struct.pack(fmt, self.values.get(name, 0.0))
                self._send(PORT_LOG, 2, data)


class _Sink:
    """The slice of a Crazyflie that cflib's Commander talks to."""

    def __init__(self):
        self.platform = SimpleNamespace(get_protocol_version=lambda: PROTOCOL_VERSION)
        self.packets: list[bytes] = []

    def send_packet(self, pk) -> None:
        self.packets.append(bytes([pk.header]) + bytes(pk.data))


def cflib_bytes(method: str, *args) -> bytes:
    """The datagram cflib's Commander produces for one call."""
    sink = _Sink()
    getattr(Commander(sink), method)(*args)
    (packet,) = sink.packets
    return packet


@pytest.fixture(scope="module")
def run_hash(hover_run) -> str:
    return config_hash(read_config(hover_run))


def app_params(config_hash_hex: str) -> dict[str, tuple[int, int]]:
    hi, lo = hash_words(config_hash_hex)
    return {
        "hoverfly.enable": (PARAM_UINT8, 0),
        "hoverfly.hashHi": (PARAM_UINT32_RO, hi),
        "hoverfly.hashLo": (PARAM_UINT32_RO, lo),
        "stabilizer.estimator": (PARAM_UINT8, 2),
    }


@pytest.fixture
def fake_cf(request, run_hash):
    """A FakeCrazyflie running this run's app; indirect parameters override params / hook."""
    kwargs = getattr(request, "param", {})
    fake = FakeCrazyflie(kwargs.get("params", app_params(run_hash)), kwargs.get("hook"))
    yield fake
    fake.close()


def position_setpoints(fake: FakeCrazyflie) -> list[tuple[float, bytes]]:
    return [(t, p) for t, p in fake.packets(PORT_GENERIC, 0) if p[1] == 7]


def test_hash_words_round_trip(run_hash):
    hi, lo = hash_words(run_hash)
    assert f"{hi:08x}{lo:08x}" == run_hash
    with pytest.raises(CrazyflieError, match="16 hex digits"):
        hash_words("abc")


def test_distance_to_path():
    assert distance_to_path((0, 0, 0.3), (0, 0, 0), (0, 0, 1)) == 0
    assert distance_to_path((0.3, 0.4, 0.5), (0, 0, 0), (0, 0, 1)) == pytest.approx(0.5)
    assert distance_to_path((0, 0, 1.5), (0, 0, 0), (0, 0, 1)) == pytest.approx(0.5)
    assert distance_to_path((1, 0, 0), (0, 0, 0), (0, 0, 0)) == 1


def test_flight_plan_holds_then_lands():
    plan = flight_plan(START, height=0.5, seconds=1.0, land_seconds=0.5, rate_hz=20)
    assert plan.shape == (30, 4)
    np.testing.assert_allclose(plan[:20], [[0.25, -0.5, 0.5, 30.0]] * 20)
    assert np.all(np.diff(plan[20:, 2]) < 0) and plan[-1, 2] == pytest.approx(0.05)


def test_fly_streams_cflib_setpoints_and_stops(hover_run, run_hash, fake_cf):
    # Climbing 1 m with max_error_m 0.5: the check measures from the take-off path.
    summary = fly(
        hover_run, fake_cf.uri, seconds=0.6, height=1.0, land_seconds=0.6, max_error_m=0.5
    )
    plan = flight_plan(START, 1.0, 0.6, 0.6, 50.0)
    sent = position_setpoints(fake_cf)
    # Byte for byte what cflib's Commander encodes for the plan, in order.
    assert [p for _, p in sent] == [cflib_bytes("send_position_setpoint", *row) for row in plan]
    times = np.array([t for t, _ in sent])
    assert np.max(np.diff(times)) < 0.2  # the app's dead-man never trips
    assert (len(times) - 1) / (times[-1] - times[0]) >= 10
    # Armed and enabled before the first setpoint; stopped, disabled, disarmed after the last.
    t_first, t_last = times[0], times[-1]
    arm = fake_cf.packets(PORT_SUPERVISOR, 1)
    assert [p[1:] for t, p in arm if t < t_first] == [bytes([1, 1])]
    assert [p[1:] for t, p in arm if t > t_last] == [bytes([1, 0])]
    enable_id = [n for n, _ in fake_cf.params].index("hoverfly.enable")
    writes = [(t, p[1:]) for t, p in fake_cf.packets(PORT_PARAM, 2)]
    assert [v for t, v in writes if t < t_first] == [struct.pack("<HB", enable_id, 1)]
    assert [v for t, v in writes if t > t_last] == [struct.pack("<HB", enable_id, 0)]
    after = [p for t, p in fake_cf.received if t > t_last]
    stop = cflib_bytes("send_stop_setpoint")
    notify = cflib_bytes("send_notify_setpoint_stop")
    assert after.index(stop) < after.index(notify)
    assert fake_cf.param("hoverfly.enable") == 0
    # The summary describes what the (fake) drone did.
    assert summary["aborted"] is None and summary["setpoints"] == len(plan)
    assert summary["start"] == pytest.approx(START[:3])
    assert summary["samples"] > 10 and summary["active_fraction"] > 0.5
    assert 0.05 <= summary["final_position"][2] < 0.3  # the lagging fake drone descended
    assert summary["app"] == {"config_hash": run_hash, "enable": 0}
    json.dumps(summary)


@pytest.mark.parametrize("fake_cf", [dict(params=app_params("0123456789abcdef"))], indirect=True)
def test_refuses_another_runs_policy(hover_run, run_hash, fake_cf):
    with pytest.raises(CrazyflieError, match=f"0123456789abcdef, not this run's {run_hash}"):
        fly(hover_run, fake_cf.uri, seconds=0.5)
    ports = {p[0] >> 4 for _, p in fake_cf.received}
    assert PORT_GENERIC not in ports and PORT_SUPERVISOR not in ports
    assert fake_cf.packets(PORT_PARAM, 2) == []


@pytest.mark.parametrize(
    "fake_cf", [dict(params={"stabilizer.estimator": (PARAM_UINT8, 2)})], indirect=True
)
def test_refuses_a_crazyflie_without_the_app(hover_run, fake_cf):
    with pytest.raises(CrazyflieError, match="does not run a hoverfly app"):
        fly(hover_run, fake_cf.uri, seconds=0.5)
    assert fake_cf.packets(PORT_GENERIC, 0) == []


def test_dry_run_checks_identity_only(hover_run, run_hash, fake_cf):
    summary = fly(hover_run, fake_cf.uri, dry_run=True)
    assert summary["dry_run"] and summary["setpoints"] == 0
    assert summary["app"]["config_hash"] == run_hash
    ports = {p[0] >> 4 for _, p in fake_cf.received}
    assert PORT_GENERIC not in ports and PORT_SUPERVISOR not in ports


def _after_setpoints(n: int, action):
    count = [0]

    def hook(fake, packet):
        if packet[0] == header(PORT_GENERIC, 0) and packet[1] == 7:
            count[0] += 1
            if count[0] == n:
                action(fake)

    return hook


def _assert_stopped_after_last_setpoint(fake: FakeCrazyflie) -> None:
    t_last = position_setpoints(fake)[-1][0]
    after = [p for t, p in fake.received if t > t_last]
    assert cflib_bytes("send_stop_setpoint") in after
    assert cflib_bytes("send_notify_setpoint_stop") in after
    assert fake.param("hoverfly.enable") == 0


def _drift(fake):
    fake.follow = False
    fake.values["stateEstimate.x"] += 1.5


@pytest.mark.parametrize("fake_cf", [dict(hook=_after_setpoints(5, _drift))], indirect=True)
def test_aborts_when_the_estimate_strays(hover_run, fake_cf):
    summary = fly(hover_run, fake_cf.uri, seconds=2.0, max_error_m=0.8)
    assert summary["aborted"].startswith("position error")
    assert 5 <= summary["setpoints"] < 20
    _assert_stopped_after_last_setpoint(fake_cf)


def _mute(fake):
    fake.streaming = False


@pytest.mark.parametrize("fake_cf", [dict(hook=_after_setpoints(5, _mute))], indirect=True)
def test_aborts_when_the_telemetry_stops(hover_run, fake_cf):
    summary = fly(hover_run, fake_cf.uri, seconds=3.0)
    assert summary["aborted"].startswith("no state estimate")
    _assert_stopped_after_last_setpoint(fake_cf)


@pytest.mark.parametrize(
    "fake_cf",
    [dict(hook=_after_setpoints(5, lambda fake: _thread.interrupt_main()))],
    indirect=True,
)
def test_ctrl_c_stops_the_motors_then_raises(hover_run, fake_cf):
    with pytest.raises(KeyboardInterrupt):
        fly(hover_run, fake_cf.uri, seconds=3.0)
    assert len(position_setpoints(fake_cf)) < 10
    _assert_stopped_after_last_setpoint(fake_cf)


def _stock_controller(fake):
    fake.app_runs = False


@pytest.mark.parametrize(
    "fake_cf", [dict(hook=_after_setpoints(1, _stock_controller))], indirect=True
)
def test_aborts_when_the_app_does_not_drive_the_motors(hover_run, fake_cf):
    summary = fly(hover_run, fake_cf.uri, seconds=3.0)
    assert summary["aborted"].startswith("the app is not driving the motors")
    assert summary["seconds"] < 1.5
    _assert_stopped_after_last_setpoint(fake_cf)


def test_refuses_an_app_of_another_run(hover_run, tmp_path):
    (tmp_path / APP_MANIFEST).write_text(json.dumps({"config_hash": "0123456789abcdef"}))
    with pytest.raises(CrazyflieError, match="generated from config 0123456789abcdef"):
        fly(hover_run, "udp://127.0.0.1:1", app_dir=tmp_path)


def test_connect_times_out_on_a_silent_endpoint(hover_run, monkeypatch):
    monkeypatch.setattr(crazyflie, "CONNECT_TIMEOUT_S", 0.5)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        uri = f"udp://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(CrazyflieError, match="cannot connect to .*: no answer within 0.5 s"):
            fly(hover_run, uri)


def test_missing_cflib_names_the_extra(hover_run, monkeypatch):
    for name in [m for m in sys.modules if m == "cflib" or m.startswith("cflib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(CrazyflieError, match=r"pip install hoverfly\[crazyflie\]"):
        fly(hover_run, "radio://0/80/2M")
