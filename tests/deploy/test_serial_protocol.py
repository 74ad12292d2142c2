"""The HIL serial protocol in Python: encoders, payload codecs, the stream parser, and hypothesis
fuzzing of the parser's invariants (random bytes, mutated, truncated, concatenated frames)."""

from __future__ import annotations

import binascii
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from deploy import serial_protocol as sp
from deploy.serial_protocol import ErrorCode, Frame, FrameError, MsgType

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame_strategy():
    """(type, seq, payload) of a well-formed frame of any type."""
    return st.sampled_from(sorted(sp.PAYLOAD_SIZE)).flatmap(
        lambda t: st.tuples(
            st.just(t),
            st.integers(0, 0xFFFF),
            st.binary(min_size=sp.PAYLOAD_SIZE[t], max_size=sp.PAYLOAD_SIZE[t]),
        )
    )


def check_events(stream: bytes, events: list) -> None:
    """Offsets increase; every accepted frame is the very bytes of the stream at its offset."""
    offsets = [e.offset for e in events]
    assert offsets == sorted(set(offsets))
    for e in events:
        assert isinstance(e, Frame | FrameError)
        if isinstance(e, Frame):
            raw = sp.encode_frame(e.msg_type, e.seq, e.payload)
            assert stream[e.offset : e.offset + len(raw)] == raw


def parse_all(stream: bytes, check_seq: bool = True, chunks: list[int] | None = None) -> list:
    p = sp.Parser(check_seq)
    events, at = [], 0
    for n in chunks or [len(stream)]:
        events += p.feed(stream[at : at + n])
        at += n
    events += p.feed(stream[at:])
    return events + p.idle()


# -- codecs -----------------------------------------------------------------------------------
def test_crc_is_ccitt_false():
    assert sp.crc16(b"123456789") == 0x29B1
    data = bytes(range(256)) * 3
    assert sp.crc16(data) == binascii.crc_hqx(data, 0xFFFF)


def test_frame_layout():
    frame = sp.encode_frame(MsgType.ERROR, 0x1234, b"\x01\x02\x03\x04")
    body = bytes([0xEE, 0x34, 0x12, 0x04, 0x00, 1, 2, 3, 4])
    assert frame == b"\xa5\x5a" + body + struct.pack("<H", binascii.crc_hqx(body, 0xFFFF))


@pytest.mark.parametrize(
    "args, match",
    [
        ((0x55, 0, b""), "unknown message type"),
        ((MsgType.OBS, 0, b"\0" * 71), "72"),
        ((MsgType.PING, 0x10000, b""), "u16"),
    ],
)
def test_encode_rejects_bad_frames(args, match):
    with pytest.raises(sp.ProtocolError, match=match):
        sp.encode_frame(*args)


def test_payload_round_trips():
    state = [0.5 * i - 3.0 for i in range(18)]
    assert sp.decode_obs(sp.encode_obs(state)) == tuple(state)
    status = sp.Status(7, sp.Flag.FAILSAFE | sp.Flag.ARMED, sp.FailsafeReason.TIMEOUT, 3,
                       (-1.0, 0.25, 0.5, 1.0))  # fmt: skip
    assert sp.decode_status(sp.encode_status(status)) == status
    pong = sp.Pong(1, 1, 1, 18, 4, 8, sp.Flag(0), 50, 10, 0, "2bb4ff3b55fbd748")
    assert sp.decode_pong(sp.encode_pong(pong)) == pong
    err = sp.ErrorReport(9, ErrorCode.BAD_CRC, MsgType.OBS)
    assert sp.decode_error(sp.encode_error(err)) == err
    with pytest.raises(sp.ProtocolError, match="18 state values"):
        sp.encode_obs(state[:17])
    with pytest.raises(sp.ProtocolError, match="expected 22"):
        sp.decode_status(b"\0" * 21)


# -- parser -----------------------------------------------------------------------------------
def obs_frame(seq: int) -> bytes:
    return sp.encode_frame(MsgType.OBS, seq, sp.encode_obs([float(seq)] * 18))


def test_frame_split_across_feeds_and_garbage():
    stream = b"\x00\xa5\xff" + obs_frame(1) + b"\xa5" + obs_frame(2)
    p, events = sp.Parser(), []
    for i in range(len(stream)):
        events += p.feed(stream[i : i + 1])
    assert [(type(e), e.seq, e.offset) for e in events] == [(Frame, 1, 3), (Frame, 2, 85)]


def test_corrupt_frame_rejected_and_next_one_recovered():
    bad = bytearray(obs_frame(1))
    bad[20] ^= 0x40
    events = parse_all(bytes(bad) + obs_frame(2))
    assert events[0] == FrameError(ErrorCode.BAD_CRC, MsgType.OBS, 1, 0)
    assert isinstance(events[-1], Frame) and events[-1].seq == 2


@pytest.mark.parametrize(
    "header, code",
    [
        (struct.pack("<BHH", MsgType.OBS, 1, 129), ErrorCode.OVERSIZE),
        (struct.pack("<BHH", 0x42, 1, 0), ErrorCode.UNKNOWN_TYPE),
        (struct.pack("<BHH", MsgType.OBS, 1, 71), ErrorCode.BAD_LENGTH),
    ],
)
def test_bad_headers_rejected_at_once(header, code):
    p = sp.Parser()
    assert p.feed(sp.SYNC + header) == [FrameError(code, header[0], 1, 0)]
    assert isinstance(p.feed(obs_frame(5))[0], Frame)


def test_truncated_frame_then_valid_frame():
    p = sp.Parser()
    assert p.feed(obs_frame(1)[:40]) == []
    assert p.idle() == [FrameError(ErrorCode.TRUNCATED, MsgType.OBS, 1, 0)]
    # Without idle the next frame completes the truncated one (bad CRC) and is then rescanned.
    events = parse_all(obs_frame(1)[:40] + obs_frame(2))
    assert [type(e) for e in events][-1] is Frame and events[-1].offset == 40


def test_sequence_window_with_wrap_around():
    events = parse_all(b"".join(obs_frame(s) for s in (65534, 65535, 0, 1, 1, 0, 32769, 3)))
    fresh = [isinstance(e, Frame) for e in events]
    # 1 again and 0 after 1 are replays; 32769 is 2^15 ahead of 1: stale too.
    assert fresh == [True, True, True, True, False, False, False, True]
    assert all(e.code == ErrorCode.STALE_SEQ for e in events if isinstance(e, FrameError))


def test_ping_and_pong_resynchronize_the_window():
    ping = sp.encode_frame(MsgType.PING, 3, b"")
    events = parse_all(obs_frame(100) + ping + obs_frame(4) + obs_frame(4))
    assert [isinstance(e, Frame) for e in events] == [True, True, True, False]
    assert sp.seq_newer(0, 0xFFFF) and not sp.seq_newer(5, 5) and not sp.seq_newer(0x8005, 5)


# -- hypothesis fuzzing -----------------------------------------------------------------------
@FUZZ
@given(st.binary(max_size=600), st.lists(st.integers(1, 50), max_size=20), st.booleans())
def test_random_bytes_never_raise(stream, chunks, check_seq):
    events = parse_all(stream, check_seq, chunks)
    check_events(stream, events)
    assert events == parse_all(stream, check_seq)  # chunking does not matter


@FUZZ
@given(
    st.lists(st.tuples(st.binary(max_size=40), frame_strategy()), min_size=1, max_size=8),
    st.binary(max_size=40),
    st.lists(st.integers(1, 64), max_size=30),
)
def test_frames_embedded_in_garbage_are_recovered(pieces, tail, chunks):
    stream, starts = b"", []
    for garbage, (t, seq, payload) in pieces:
        stream += garbage
        starts.append(len(stream))
        stream += sp.encode_frame(t, seq, payload)
    stream += tail
    events = parse_all(stream, check_seq=False, chunks=chunks)
    check_events(stream, events)
    frames = {e.offset for e in events if isinstance(e, Frame)}
    assert set(starts) <= frames


def test_every_single_bit_flip_is_rejected():
    for t in (MsgType.PING, MsgType.ACTION, MsgType.PONG):
        raw = sp.encode_frame(t, 0x0102, bytes(range(sp.PAYLOAD_SIZE[t])))
        for bit in range(16, 8 * len(raw)):  # a flipped SYNC bit hides the frame altogether
            bad = bytearray(raw)
            bad[bit // 8] ^= 0x80 >> (bit % 8)
            assert not [e for e in parse_all(bytes(bad)) if isinstance(e, Frame)], (t, bit)


@FUZZ
@given(frame_strategy(), st.integers(0, 10_000), st.integers(1, 16), st.binary(max_size=20))
def test_burst_errors_in_payload_and_crc_are_never_accepted(frame, position, width, tail):
    """CRC-16 catches every burst of ≤ 16 bits within a codeword of fixed length."""
    raw = bytearray(sp.encode_frame(*frame))
    bits = 8 * (len(raw) - sp.HEADER_SIZE)
    first = position % bits
    for bit in range(first, min(first + width, bits)):
        raw[sp.HEADER_SIZE + bit // 8] ^= 0x80 >> (bit % 8)
    events = parse_all(bytes(raw) + tail, check_seq=False)
    assert not [e for e in events if isinstance(e, Frame) and e.offset == 0]


@FUZZ
@given(frame_strategy(), st.integers(0, 200), frame_strategy())
def test_truncated_frame_followed_by_a_valid_one(first, cut, second):
    full = sp.encode_frame(*first)
    head = full[: cut % len(full)]
    stream = head + sp.encode_frame(*second)
    # The cut bytes may be exactly the start of the next frame (a CRC ending in A5 5A ...): then
    # the first frame is complete and valid, and no parser could call it truncated.
    assume(not stream.startswith(full))
    events = parse_all(stream, check_seq=False)
    frames = [e for e in events if isinstance(e, Frame)]
    assert frames and frames[-1].offset == len(head)
    assert (frames[-1].msg_type, frames[-1].seq, frames[-1].payload) == second


@FUZZ
@given(st.integers(0, 0xFFFF), st.lists(st.integers(1, 1000), min_size=2, max_size=10), st.data())
def test_replayed_frames_rejected(start, steps, data):
    seqs = [start]
    for s in steps:
        seqs.append((seqs[-1] + s) & 0xFFFF)
    frames = [obs_frame(s) for s in seqs]
    replay = data.draw(st.sampled_from(frames))
    events = parse_all(b"".join(frames) + replay)
    assert all(isinstance(e, Frame) for e in events[:-1])
    assert isinstance(events[-1], FrameError) and events[-1].code == ErrorCode.STALE_SEQ
