"""The hardware-in-the-loop serial protocol: pure encoders and an incremental stream parser, no I/O.

The C side (`firmware_export/hil/protocol.{h,c}`) implements the same bytes and the same parser
state machine; a differential test feeds both the same streams and compares their events.

Frame (all integers little-endian)::

    offset  size  field
    0       2     SYNC = A5 5A
    2       1     type
    3       2     seq      u16, per direction, +1 for every frame a side sends (wraps at 2^16)
    5       2     length   u16, payload bytes, ≤ MAX_PAYLOAD and exactly PAYLOAD_SIZE[type]
    7       len   payload
    7+len   2     crc      CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, no final
                           xor) over bytes 2 .. 7+len−1 (type, seq, length, payload)

Messages (host → target: types < 0x80; target → host: types ≥ 0x80)::

    PING      0x01   0 B   → PONG
    RESET     0x02   0 B   policy_reset(), clears the failsafe, disarms the watchdog → RESET_ACK
    OBS       0x03  72 B   18 × f32: the state (position error 3, rotation matrix 9 row-major,
                           velocity error 3, angular velocity 3; see deploy/policy.py) → ACTION
    PONG      0x81  30 B   echo_seq u16, version u8, precision u8 (0 float32, 1 int8),
                           state_size u8, action_size u8, history u8, flags u8,
                           failsafe_frames u16, frame_period_ms u16, selftest_failures u16,
                           config_hash 16 ASCII bytes (the run's config hash, NUL-padded)
    RESET_ACK 0x82  22 B   status (below)
    ACTION    0x83  22 B   status: echo_seq u16 (the request's seq), flags u8, reason u8,
                           rx_errors u16 (frames rejected since boot, wraps), action 4 × f32
                           (the motor command now applied, in [-1, 1]; −1 = motor off)
    FAILSAFE  0x84  22 B   status, sent unsolicited when the target enters failsafe
                           (echo_seq = seq of the last OBS accepted)
    ERROR     0xEE   4 B   echo_seq u16 (the rejected frame's seq as read), code u8, type u8;
                           the target sends one for every candidate it rejects

Status flags: FAILSAFE (bit 0), SELFTEST_FAILED (bit 1: `policy_test()` failed at boot), ARMED
(bit 2: an OBS was accepted since the last RESET). Failsafe reason: 1 timeout, 2 bad frames.

Parser (both sides): it scans for SYNC, then rejects, in this order, a length > MAX_PAYLOAD
(OVERSIZE), an unknown type (UNKNOWN_TYPE) or a length that is not the type's (BAD_LENGTH) as soon
as the 7 header bytes are in, then waits for the whole frame and checks the CRC (BAD_CRC). Each of
these rejections drops only the first byte of the candidate and rescans the buffered bytes, so a
valid frame that started inside a corrupt or truncated one is still recovered. `idle()` (the line
went quiet) abandons an incomplete candidate (TRUNCATED) the same way. A frame with a good CRC is
then checked against the sequence window: it is stale (STALE_SEQ, consumed whole) unless
0 < (seq − last) mod 2^16 < 2^15, where `last` is the seq of the last frame accepted from that
peer (RFC 1982 serial-number arithmetic). PING and PONG open a session: they are always accepted
and set `last`, so a rebooted target or a restarted host resynchronizes. The window rejects
duplicated and stale frames on a noisy link; it is no defence against a malicious peer (there is
no authentication). The parser buffers at most one frame (MAX_FRAME bytes).

Target failsafe (built in with HIL_FAILSAFE_FRAMES = N and HIL_FRAME_PERIOD_MS = P, by default
100 and 10 ms): once armed (first OBS after boot or RESET), N·P ms without a valid OBS, or N
consecutive rejected candidates, latch the failsafe: the motors get −1 (0 rpm), a FAILSAFE frame
is sent, and every ACTION reports the FAILSAFE flag with −1 until a RESET. A partial frame with no
byte for HIL_IDLE_MS (50 ms) is abandoned (`idle()`).
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Sequence

SYNC = b"\xa5\x5a"
HEADER_SIZE = 7
CRC_SIZE = 2
MAX_PAYLOAD = 128
MAX_FRAME = HEADER_SIZE + MAX_PAYLOAD + CRC_SIZE
PROTOCOL_VERSION = 1
STATE_SIZE = 18
ACTION_SIZE = 4
HASH_SIZE = 16


class MsgType(enum.IntEnum):
    PING = 0x01
    RESET = 0x02
    OBS = 0x03
    PONG = 0x81
    RESET_ACK = 0x82
    ACTION = 0x83
    FAILSAFE = 0x84
    ERROR = 0xEE


class ErrorCode(enum.IntEnum):
    """Why the parser (or the target's handler) rejected a frame."""

    BAD_CRC = 1
    OVERSIZE = 2
    UNKNOWN_TYPE = 3
    BAD_LENGTH = 4
    STALE_SEQ = 5
    TRUNCATED = 6
    UNEXPECTED = 7
    """A well-formed frame the receiver does not take (e.g. an ACTION sent to the target)."""


class Flag(enum.IntFlag):
    FAILSAFE = 1
    SELFTEST_FAILED = 2
    ARMED = 4


class FailsafeReason(enum.IntEnum):
    NONE = 0
    TIMEOUT = 1
    BAD_FRAMES = 2


class Precision(enum.IntEnum):
    FLOAT32 = 0
    INT8 = 1


_STATUS = struct.Struct("<HBBH4f")
_PONG = struct.Struct(f"<HBBBBBBHHH{HASH_SIZE}s")
_ERROR = struct.Struct("<HBB")
_OBS = struct.Struct(f"<{STATE_SIZE}f")
_HEADER = struct.Struct("<BHH")
_CRC = struct.Struct("<H")

PAYLOAD_SIZE: dict[int, int] = {
    MsgType.PING: 0,
    MsgType.RESET: 0,
    MsgType.OBS: _OBS.size,
    MsgType.PONG: _PONG.size,
    MsgType.RESET_ACK: _STATUS.size,
    MsgType.ACTION: _STATUS.size,
    MsgType.FAILSAFE: _STATUS.size,
    MsgType.ERROR: _ERROR.size,
}
SESSION_TYPES = frozenset({MsgType.PING, MsgType.PONG})


class ProtocolError(ValueError):
    """A frame or payload that cannot be encoded or decoded (never raised by `Parser`)."""


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc16(data: bytes | bytearray | memoryview, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE (check value of b"123456789": 0x29B1)."""
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC_TABLE[(crc >> 8) ^ byte]
    return crc


def encode_frame(msg_type: int, seq: int, payload: bytes = b"") -> bytes:
    """SYNC + header + payload + CRC; `ProtocolError` for an unknown type or a wrong length."""
    if msg_type not in PAYLOAD_SIZE:
        raise ProtocolError(f"unknown message type 0x{msg_type:02x}")
    if len(payload) != PAYLOAD_SIZE[msg_type]:
        raise ProtocolError(
            f"{MsgType(msg_type).name} payload is {len(payload)} bytes, "
            f"expected {PAYLOAD_SIZE[msg_type]}"
        )
    if not 0 <= seq <= 0xFFFF:
        raise ProtocolError(f"sequence number {seq} is not a u16")
    body = _HEADER.pack(msg_type, seq, len(payload)) + bytes(payload)
    return SYNC + body + _CRC.pack(crc16(body))


def seq_newer(seq: int, last: int) -> bool:
    """`seq` follows `last` (serial-number arithmetic): 0 < (seq − last) mod 2^16 < 2^15."""
    return 0 < (seq - last) & 0xFFFF < 0x8000


# -- payloads ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Status:
    """Payload of ACTION, RESET_ACK and FAILSAFE. `action`: 4 normalized motor commands."""

    echo_seq: int
    flags: Flag
    reason: FailsafeReason
    rx_errors: int
    action: tuple[float, float, float, float]


@dataclasses.dataclass(frozen=True)
class Pong:
    """Payload of PONG: what the firmware was built from."""

    echo_seq: int
    version: int
    precision: int
    state_size: int
    action_size: int
    history: int
    flags: Flag
    failsafe_frames: int
    frame_period_ms: int
    selftest_failures: int
    config_hash: str


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """Payload of ERROR: the code and the rejected frame's seq and type (as read)."""

    echo_seq: int
    code: int
    msg_type: int


def encode_obs(state: Sequence[float]) -> bytes:
    """18 state values → 72 bytes of little-endian f32."""
    if len(state) != STATE_SIZE:
        raise ProtocolError(f"OBS takes {STATE_SIZE} state values, got {len(state)}")
    return _OBS.pack(*(float(x) for x in state))


def decode_obs(payload: bytes) -> tuple[float, ...]:
    return _unpack(_OBS, payload, "OBS")


def encode_status(s: Status) -> bytes:
    return _STATUS.pack(s.echo_seq, int(s.flags), int(s.reason), s.rx_errors, *s.action)


def decode_status(payload: bytes) -> Status:
    echo, flags, reason, rx_errors, *action = _unpack(_STATUS, payload, "status")
    if reason not in FailsafeReason._value2member_map_:
        raise ProtocolError(f"unknown failsafe reason {reason}")
    return Status(echo, Flag(flags), FailsafeReason(reason), rx_errors, tuple(action))


def encode_pong(p: Pong) -> bytes:
    raw = p.config_hash.encode("ascii")
    if len(raw) > HASH_SIZE:
        raise ProtocolError(f"config hash {p.config_hash!r} is longer than {HASH_SIZE} bytes")
    fields = dataclasses.astuple(p)[:-1]
    return _PONG.pack(*(int(f) for f in fields), raw)


def decode_pong(payload: bytes) -> Pong:
    *fields, raw = _unpack(_PONG, payload, "PONG")
    try:
        text = raw.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"PONG config hash {raw!r} is not ASCII") from None
    fields[6] = Flag(fields[6])
    return Pong(*fields, text)


def encode_error(e: ErrorReport) -> bytes:
    return _ERROR.pack(e.echo_seq, e.code, e.msg_type)


def decode_error(payload: bytes) -> ErrorReport:
    return ErrorReport(*_unpack(_ERROR, payload, "ERROR"))


def _unpack(fmt: struct.Struct, payload: bytes, what: str) -> tuple:
    if len(payload) != fmt.size:
        raise ProtocolError(f"{what} payload is {len(payload)} bytes, expected {fmt.size}")
    return fmt.unpack(payload)


# -- stream parser ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Frame:
    """A frame with a good CRC, a known type, the type's length and a fresh seq."""

    msg_type: int
    seq: int
    payload: bytes
    offset: int = 0
    """Stream offset of its first SYNC byte (bytes fed to the parser before it)."""


@dataclasses.dataclass(frozen=True)
class FrameError:
    """A rejected candidate: `code`, and the type and seq as read from its header (−1 when the
    header was incomplete)."""

    code: ErrorCode
    msg_type: int
    seq: int
    offset: int = 0
    """Stream offset of the candidate's first SYNC byte."""


class Parser:
    """Incremental frame parser: `feed(bytes)` and `idle()` return the events, in stream order.

    It never raises on any input. `last_seq` is the seq of the last frame accepted (None before
    the first). With `check_seq=False` the sequence window is not applied.
    """

    def __init__(self, check_seq: bool = True):
        self.check_seq = check_seq
        self.last_seq: int | None = None
        self._buf = bytearray()
        self._offset = 0  # stream offset of _buf[0]

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame | FrameError]:
        self._buf += data
        return self._drain(flush=False)

    def idle(self) -> list[Frame | FrameError]:
        """The line went quiet: give up on any incomplete frame and rescan what is buffered."""
        return self._drain(flush=True)

    def _drain(self, flush: bool) -> list[Frame | FrameError]:
        buf, events = self._buf, []
        while True:
            start = buf.find(SYNC)
            if start < 0:
                # Keep a trailing first SYNC byte: its partner may come in the next feed.
                self._drop(len(buf) - (1 if buf[-1:] == SYNC[:1] and not flush else 0))
                return events
            self._drop(start)
            event, used = self._candidate(flush)
            if event is None:
                return events
            events.append(event)
            self._drop(used)

    def _drop(self, n: int) -> None:
        del self._buf[:n]
        self._offset += n

    def _candidate(self, flush: bool) -> tuple[Frame | FrameError | None, int]:
        """The frame starting at buf[0] (a SYNC): (event, bytes to drop), or (None, 0): wait."""
        buf, at = self._buf, self._offset
        if len(buf) < HEADER_SIZE:
            return (FrameError(ErrorCode.TRUNCATED, -1, -1, at), 1) if flush else (None, 0)
        msg_type, seq, length = _HEADER.unpack_from(buf, 2)
        code = None
        if length > MAX_PAYLOAD:
            code = ErrorCode.OVERSIZE
        elif msg_type not in PAYLOAD_SIZE:
            code = ErrorCode.UNKNOWN_TYPE
        elif length != PAYLOAD_SIZE[msg_type]:
            code = ErrorCode.BAD_LENGTH
        total = HEADER_SIZE + length + CRC_SIZE
        if code is None and len(buf) < total:
            if not flush:
                return None, 0
            code = ErrorCode.TRUNCATED
        if code is None:
            (crc,) = _CRC.unpack_from(buf, total - CRC_SIZE)
            if crc16(buf[2 : total - CRC_SIZE]) != crc:
                code = ErrorCode.BAD_CRC
        if code is not None:
            return FrameError(code, msg_type, seq, at), 1
        fresh = msg_type in SESSION_TYPES or self.last_seq is None or seq_newer(seq, self.last_seq)
        if self.check_seq and not fresh:
            return FrameError(ErrorCode.STALE_SEQ, msg_type, seq, at), total
        self.last_seq = seq
        return Frame(msg_type, seq, bytes(buf[HEADER_SIZE : total - CRC_SIZE]), at), total
