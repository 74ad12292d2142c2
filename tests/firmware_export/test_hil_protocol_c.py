"""The C twin of the HIL protocol (`firmware_export/hil/protocol.c`), built for the host under
AddressSanitizer + UndefinedBehaviorSanitizer: a bounded random-mutation fuzz run of its parser
(`host_driver.c fuzz`, invariants checked inside; libFuzzer needs clang, which is not installed),
a check that the fuzzer catches a planted bug, and differential tests against the Python twin
(the same streams give the same events; frames encoded on one side decode on the other)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from deploy import serial_protocol as sp

HIL = Path(__file__).resolve().parents[2] / "firmware_export" / "hil"
CFLAGS = [
    "-std=c99",
    "-O1",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]
DIFF = settings(max_examples=60, deadline=None)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="host gcc not installed")


def build(out: Path, protocol_c: Path = HIL / "protocol.c") -> Path:
    cmd = ["gcc", *CFLAGS, f"-I{HIL}", str(protocol_c), str(HIL / "host_driver.c"), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("hil_c") / "host_driver")


def run(driver: Path, *args: str, data: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([str(driver), *args], input=data, capture_output=True, timeout=60)


@pytest.mark.parametrize("seed", ["1", "2"])
def test_fuzz_under_sanitizers(driver, seed):
    proc = run(driver, "fuzz", "40000", seed)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    found = re.fullmatch(
        r"fuzz ok: 40000 iterations, (\d+) bytes, (\d+) frames, (\d+) rejections\n",
        proc.stdout.decode(),
    )
    assert found, proc.stdout
    assert int(found[2]) > 10_000 and int(found[3]) > 10_000  # both paths exercised


def test_fuzzer_catches_a_planted_bug(tmp_path):
    """A parser that skips a whole candidate after a bad CRC (instead of rescanning from its
    second byte) loses frames that started inside it: the fuzz invariants must notice."""
    src = (HIL / "protocol.c").read_text()
    rescan = "fn(ctx, &ev);\n        return 1;\n    }\n    uint16_t seq"
    assert src.count(rescan) == 1
    bad = src.replace(rescan, rescan.replace("return 1;", "return ev.code == 1 ? total : 1;"))
    (tmp_path / "protocol.c").write_text(bad)
    mutant = build(tmp_path / "mutant", tmp_path / "protocol.c")
    proc = run(mutant, "fuzz", "40000", "1")
    assert proc.returncode != 0
    assert b"intact frame lost" in proc.stderr


# -- differential -----------------------------------------------------------------------------
def python_lines(stream: bytes, check_seq: bool) -> list[str]:
    """The Python parser's events in host_driver's `parse` output format."""
    p = sp.Parser(check_seq)
    lines = []
    for e in p.feed(stream) + p.idle():
        if isinstance(e, sp.FrameError):
            lines.append(f"E {e.offset} {int(e.code)} {e.msg_type} {e.seq}")
            continue
        lines.append(f"F {e.offset} {e.msg_type} {e.seq} {e.payload.hex()}")
        lines += decoded_lines(e)
    return lines


def bits(x: float) -> str:
    return f"{struct.unpack('<I', struct.pack('<f', x))[0]:08x}"


def decoded_lines(f: sp.Frame) -> list[str]:
    t = f.msg_type
    # Floats are compared as their raw 32-bit words: a signalling NaN would come back quieted
    # from a round trip through a Python float, while C copies the bits.
    if t == sp.MsgType.OBS:
        words = struct.unpack(f"<{len(sp.decode_obs(f.payload))}I", f.payload)
        return ["obs " + " ".join(f"{w:08x}" for w in words)]
    if t in (sp.MsgType.ACTION, sp.MsgType.RESET_ACK, sp.MsgType.FAILSAFE):
        s = struct.unpack("<HBBH4I", f.payload)  # raw fields: the reason byte may be anything
        return [f"status {s[0]} {s[1]} {s[2]} {s[3]} " + " ".join(f"{w:08x}" for w in s[4:])]
    if t == sp.MsgType.PONG:
        *fields, raw = struct.unpack("<HBBBBBBHHH16s", f.payload)
        return ["pong " + " ".join(str(v) for v in fields) + " " + raw.hex()]
    return []


def piece():
    """A stream piece: a frame (maybe mutated or cut), a random header, or garbage."""
    frame = st.sampled_from(sorted(sp.PAYLOAD_SIZE)).flatmap(
        lambda t: st.builds(
            sp.encode_frame,
            st.just(t),
            st.integers(0, 0xFFFF),
            st.binary(min_size=sp.PAYLOAD_SIZE[t], max_size=sp.PAYLOAD_SIZE[t]),
        )
    )
    flip = st.tuples(frame, st.integers(0, 10_000)).map(
        lambda fp: (
            fp[0][: fp[1] % len(fp[0])]
            + bytes([fp[0][fp[1] % len(fp[0])] ^ 0x04])
            + fp[0][fp[1] % len(fp[0]) + 1 :]
        )
    )
    cut = st.tuples(frame, st.integers(0, 200)).map(lambda fc: fc[0][: fc[1] % len(fc[0])])
    garbage = st.lists(st.sampled_from([0xA5, 0x5A, 0x00, 0x03, 0x48, 0xFF]), max_size=24).map(
        bytes
    )
    header = st.builds(  # a random header: any type, any length
        lambda t, seq, n, tail: sp.SYNC + struct.pack("<BHH", t, seq, n) + tail,
        st.integers(0, 0xFF),
        st.integers(0, 0xFFFF),
        st.one_of(st.integers(0, 140), st.integers(0, 0xFFFF)),
        st.binary(max_size=30),
    )
    return st.one_of(frame, flip, cut, garbage, header, st.binary(max_size=16))


@DIFF
@given(st.lists(piece(), max_size=12), st.integers(1, 40), st.booleans())
@example([sp.encode_frame(sp.MsgType.OBS, 0, bytes(46) + b"\x81\x7f" + bytes(24))], 1, False)
def test_c_and_python_parse_identically(driver, pieces, chunk, check_seq):
    stream = b"".join(pieces)
    args = ["parse", str(chunk)] + ([] if check_seq else ["noseq"])
    proc = run(driver, *args, data=stream)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().splitlines() == python_lines(stream, check_seq)


f32 = st.floats(width=32, allow_nan=False)
u8, u16 = st.integers(0, 0xFF), st.integers(0, 0xFFFF)


@DIFF
@given(
    st.lists(f32, min_size=18, max_size=18),
    st.tuples(u16, st.sampled_from(list(sp.Flag)), st.sampled_from(list(sp.FailsafeReason)), u16),
    st.lists(f32, min_size=4, max_size=4),
    st.tuples(u16, u8, u8, u8, u8, u8, st.sampled_from(list(sp.Flag)), u16, u16, u16),
    st.text("0123456789abcdef", min_size=16, max_size=16),
    st.tuples(u16, u8, u8),
    st.lists(u16, min_size=5, max_size=5),
)
def test_c_encodes_what_python_decodes(driver, state, status, action, pong, chash, err, seqs):
    script = [
        f"obs {seqs[0]} " + " ".join(bits(x) for x in state),
        f"status {int(sp.MsgType.ACTION)} {seqs[1]} "
        + " ".join(str(int(v)) for v in status)
        + " "
        + " ".join(bits(x) for x in action),
        f"pong {seqs[2]} " + " ".join(str(int(v)) for v in pong) + " " + chash.encode().hex(),
        f"error {seqs[3]} " + " ".join(str(v) for v in err),
        f"raw {int(sp.MsgType.PING)} {seqs[4]} ",
    ]
    proc = run(driver, "encode", data=("\n".join(script) + "\n").encode())
    assert proc.returncode == 0, proc.stderr.decode()
    frames = sp.Parser(check_seq=False).feed(proc.stdout)
    assert [f.seq for f in frames] == seqs
    assert all(isinstance(f, sp.Frame) for f in frames)
    assert sp.decode_obs(frames[0].payload) == tuple(state)
    assert sp.decode_status(frames[1].payload) == sp.Status(*status, tuple(action))
    assert sp.decode_pong(frames[2].payload) == sp.Pong(*pong, chash)
    assert sp.decode_error(frames[3].payload) == sp.ErrorReport(*err)
    assert frames[4].msg_type == sp.MsgType.PING and frames[4].payload == b""
