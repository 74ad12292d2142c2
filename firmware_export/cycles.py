"""Cycle estimate of code run under QEMU, from its dynamic instruction mix (Cortex-M4 model).

QEMU counts instructions exactly but not cycles. `trace_mix` runs an ELF under QEMU with one
instruction per translation block (`-singlestep -d exec,nochain`), so the log holds every executed
instruction's address, in order; the instructions executed between the first entry of
`bench_trace_begin` and of `bench_trace_end`, outside the `exclude` functions (the bench loop
itself), are disassembled (`arm-none-eabi-objdump`) and priced with the Cortex-M4 Technical
Reference Manual's timings (r0p1, tables 3-1 and 7-1):

  class                                             cycles (lo / mid / hi)
  ALU, shifts, extends, SXTB16, saturate, compare   1
  IT                                                0 / 1 / 1 (usually folded)
  MUL, SMLAD, SMULL, SMMUL and other DSP multiplies 1;  MLA, MLS 2;  SDIV, UDIV 2 / 7 / 12
  LDR*, STR*, VLDR, VSTR (single)                   2, or 1 when the previous instruction was a
                                                    load/store (address/data phases pipeline;
                                                    hi: always 2)
  LDRD, STRD 3;  LDM, STM, PUSH, POP, VLDM, VSTM, VPUSH, VPOP   1 + words
  branch taken (B, BL, BX, CBZ, POP/LDR to pc) +P   P = 1 / 2 / 3 pipeline refill; not taken 1
  VADD, VSUB, VMUL, VNEG, VABS, VCVT, VCMP, VMOV, VMRS   1 (VMOV of two registers 2)
  VMLA, VMLS, VFMA, VFMS, VNMLA, VNMLS               3;  VDIV, VSQRT 14

Not modelled: flash wait states (5 at 168 MHz; the ART accelerator hides most instruction fetches,
but constant data such as weights read from flash can stall, see `flash_stall_bound_cycles`),
FPU/integer result-forwarding hazards, interrupts. `mid` is the point estimate; lo/hi bound the
model's own choices; instructions × 1 cycle is an absolute floor.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from firmware_export import build

CLOCK_HZ = 168e6
FLASH_WAIT_STATES = 5
FLASH_LINE_BYTES = 16
REFILL = {"lo": 1, "mid": 2, "hi": 3}
_CONDS = ("eq", "ne", "cs", "hs", "cc", "lo", "mi", "pl", "vs", "vc", "hi", "ls", "ge", "lt")
_CONDS += ("gt", "le", "al")
_ONE = {
    *"add adc sub sbc rsb and orr orn eor bic mov mvn lsl lsr asr ror rrx cmp cmn tst teq".split(),
    *"movw movt adr ubfx sbfx bfi bfc clz rbit rev rev16 revsh sxtb sxth uxtb uxth sxtb16".split(),
    *"uxtb16 sxtab sxtah uxtab uxtah sxtab16 ssat usat ssat16 usat16 qadd qsub qdadd qdsub".split(),
    *"sadd16 ssub16 sadd8 ssub8 uadd8 usub8 qadd16 qsub16 qadd8 qsub8 shadd16 sel pkhbt".split(),
    *"pkhtb addw subw neg nop dmb dsb isb cpsid cpsie mrs msr".split(),
}
_MUL1 = {
    *"mul smull umull smlal umlal smlad smladx smlsd smuad smuadx smusd smlald smlsld".split(),
    *"smulbb smulbt smultb smultt smlabb smlabt smlatb smlatt smulwb smulwt smlawb smlawt".split(),
    *"smmul smmulr smmla smmlar smmls usad8 usada8 umaal".split(),
}
_MUL2 = {"mla", "mls"}
_DIV = {"sdiv", "udiv"}
_LOAD1 = {*"ldr ldrb ldrh ldrsb ldrsh ldrex str strb strh strex vldr vstr".split()}
_PAIR = {"ldrd", "strd"}
_MULTI = {*"ldm ldmia ldmdb stm stmia stmdb push pop vldm vldmia vldmdb".split()}
_MULTI |= {*"vstm vstmia vstmdb vpush vpop".split()}
_BRANCH = {"b", "bl", "bx", "blx", "cbz", "cbnz", "tbb", "tbh"}
_FP1 = {*"vadd vsub vmul vnmul vneg vabs vcvt vcvtr vcmp vcmpe vmov vmrs vmsr".split()}
_FP3 = {*"vmla vmls vfma vfms vnmla vnmls vfnma vfnms".split()}
_FP14 = {"vdiv", "vsqrt"}
_KNOWN = _ONE | _MUL1 | _MUL2 | _DIV | _LOAD1 | _PAIR | _MULTI | _BRANCH | _FP1 | _FP3 | _FP14
_KNOWN |= {"it"}
_OBJDUMP_LINE = re.compile(r"^\s*([0-9a-f]+):\s+((?:[0-9a-f]{4}\s?){1,2})\s+(\S+)\s*(.*)$")
_TRACE_LINE = re.compile(r"\[[0-9a-f]+/([0-9a-f]+)/")


def base_mnemonic(mnemonic: str) -> str:
    """'vldrle.f32' -> 'vldr', 'adds' -> 'add', 'bne.n' -> 'b', 'itte' -> 'it'."""
    m = mnemonic.lower().split(".")[0]
    if re.fullmatch(r"it[te]{0,3}", m):
        return "it"
    for cand in (m, _strip_cond(m), m[:-1] if m.endswith("s") else m):
        if cand in _KNOWN:
            return cand
    stripped = _strip_cond(m)
    if stripped.endswith("s") and stripped[:-1] in _KNOWN:
        return stripped[:-1]
    raise ValueError(f"no cycle class for instruction {mnemonic!r}")


def _strip_cond(m: str) -> str:
    return m[:-2] if len(m) > 2 and m[-2:] in _CONDS else m


def disassemble(elf: str | Path) -> dict[int, tuple[str, str, int]]:
    """address -> (mnemonic, operands, size in bytes) of every instruction in .text."""
    tool = build.require_tool("arm-none-eabi-objdump")
    text = subprocess.run(
        [tool, "-d", "--section=.text", str(elf)], capture_output=True, text=True, check=True
    ).stdout
    out = {}
    for line in text.splitlines():
        m = _OBJDUMP_LINE.match(line)
        if m and not m.group(3).startswith("."):  # skip .word literal pools
            size = 2 * len(m.group(2).split())
            operands = m.group(4).split("@")[0].split(";")[0].strip()
            out[int(m.group(1), 16)] = (m.group(3), operands, size)
    return out


def symbols(elf: str | Path) -> dict[str, tuple[int, int]]:
    """Function name -> (start, end) addresses (Thumb bit cleared)."""
    tool = build.require_tool("arm-none-eabi-nm")
    text = subprocess.run(
        [tool, "-S", "--defined-only", str(elf)], capture_output=True, text=True, check=True
    ).stdout
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2].lower() == "t":
            start = int(parts[0], 16) & ~1
            out[parts[3]] = (start, start + int(parts[1], 16))
    return out


def trace_pcs(elf: str | Path, timeout: float = 120.0) -> list[int]:
    """Addresses of every instruction the ELF executes under QEMU, in order."""
    with tempfile.TemporaryDirectory(prefix="hoverfly-trace-") as tmp:
        log = Path(tmp) / "exec.log"
        extra = ("-singlestep", "-d", "exec,nochain", "-D", str(log))
        status, _ = build.run_qemu(elf, timeout=timeout, extra_args=extra)
        if status != 0:
            raise build.ToolchainError(f"{Path(elf).name} exited with {status} while tracing")
        pcs = []
        with open(log) as f:
            for line in f:
                m = _TRACE_LINE.search(line)
                if m:
                    pcs.append(int(m.group(1), 16))
    return pcs


def trace_mix(
    elf: str | Path,
    calls: int,
    exclude: Iterable[str] = ("main", "time_calls", "next_state", "counter_read"),
) -> dict:
    """Per-call instruction mix and cycle estimate of the code timed between the bench markers.

    Returns {"instructions", "cycles": {lo, mid, hi}, "us": {...}, "mix": {class: count}} per
    call (floats: totals / `calls`)."""
    insns = disassemble(elf)
    syms = symbols(elf)
    begin, end = syms["bench_trace_begin"][0], syms["bench_trace_end"][0]
    skip = [syms[n] for n in exclude if n in syms]
    pcs = trace_pcs(elf)
    try:
        first = pcs.index(begin)
        last = pcs.index(end, first)
    except ValueError as e:
        raise build.ToolchainError(f"{Path(elf).name}: bench markers not reached") from e
    window = pcs[first : last + 1]
    totals = {k: 0 for k in REFILL}
    mix: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    starts = sorted((a, b, name) for name, (a, b) in syms.items())
    count, prev_mem = 0, False
    for pc, nxt in zip(window[:-1], window[1:], strict=True):
        if any(a <= pc < b for a, b in skip) or pc in (begin, end):
            prev_mem = False
            continue
        mnemonic, operands, size = insns[pc]
        name = base_mnemonic(mnemonic)
        taken = nxt != pc + size
        cls, cost = _cost(name, operands, taken, prev_mem)
        mix[cls] += 1
        by_function[_owner(starts, pc)] += cost["mid"]
        count += 1
        for k in totals:
            totals[k] += cost[k]
        prev_mem = name in _LOAD1
    per = {k: v / calls for k, v in totals.items()}
    return {
        "instructions": count / calls,
        "cycles": per,
        "us": {k: v / CLOCK_HZ * 1e6 for k, v in per.items()},
        "mix": {k: v / calls for k, v in sorted(mix.items())},
        "mid_cycles_by_function": {k: v / calls for k, v in by_function.most_common()},
    }


def _owner(starts: list[tuple[int, int, str]], pc: int) -> str:
    return next((name for a, b, name in starts if a <= pc < b), "?")


def flash_stall_bound_cycles(flash_data_bytes: int) -> float:
    """Upper bound of the stalls of streaming `flash_data_bytes` of constants from flash once:
    every 16-byte flash line a miss of FLASH_WAIT_STATES cycles (no ART data-cache hit)."""
    return flash_data_bytes / FLASH_LINE_BYTES * FLASH_WAIT_STATES


def _words(operands: str) -> int:
    """Registers (32-bit words) in a register list such as '{r4, r5, lr}' or '{d8-d12}'."""
    inner = operands[operands.index("{") + 1 : operands.index("}")]
    n = 0
    for item in inner.split(","):
        item = item.strip()
        width = 2 if item.startswith("d") else 1
        if "-" in item:
            a, b = (int(re.sub(r"\D", "", x)) for x in item.split("-"))
            n += (b - a + 1) * width
        else:
            n += width
    return n


def _cost(name: str, operands: str, taken: bool, prev_mem: bool) -> tuple[str, dict[str, float]]:
    def flat(c: float, cls: str) -> tuple[str, dict[str, float]]:
        return cls, {k: c for k in REFILL}

    writes_pc = "pc" in operands.split(",")[0] or ("pc" in operands and name in _MULTI)
    if name in _BRANCH or (writes_pc and taken):
        refill = {k: (1 + p if taken else 1) for k, p in REFILL.items()}
        if name in _MULTI:
            refill = {k: v + _words(operands) for k, v in refill.items()}
        elif name in _LOAD1:
            refill = {k: v + 1 for k, v in refill.items()}
        return ("branch_taken" if taken else "branch_not_taken"), refill
    if name == "it":
        return "it", {"lo": 0, "mid": 1, "hi": 1}
    if name in _ONE:
        return flat(1, "alu")
    if name in _MUL1:
        return flat(1, "mul_dsp")
    if name in _MUL2:
        return flat(2, "mla")
    if name in _DIV:
        return "div", {"lo": 2, "mid": 7, "hi": 12}
    if name in _LOAD1:
        c = 1 if prev_mem else 2
        cls = "fp_load_store" if name.startswith("v") else "load_store"
        return cls, {"lo": c, "mid": c, "hi": 2}
    if name in _PAIR:
        return flat(3, "load_store_pair")
    if name in _MULTI:
        return flat(1 + _words(operands), "load_store_multiple")
    if name == "vmov" and operands.count(",") >= 3:
        return flat(2, "fp_simple")
    if name in _FP1:
        return flat(1, "fp_simple")
    if name in _FP3:
        return flat(3, "fp_mac")
    if name in _FP14:
        return flat(14, "fp_div_sqrt")
    raise ValueError(f"no cycle class for {name!r}")
