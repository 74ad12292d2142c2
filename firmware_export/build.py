"""Build C for the STM32F405 (Cortex-M4F) and run it bare-metal under QEMU's `netduinoplus2`.

`compile_elf` links any C sources with the harness in `harness/` (vector table and reset handler,
linker script, semihosting, polled USART1, TIM2 instruction counter); `size` reads
`arm-none-eabi-size`; `run_qemu` runs an ELF with semihosting (its console output and exit status
come back) and, by default, `-icount shift=0`: one guest instruction per nanosecond of virtual time,
deterministic, so the harness counter (`harness/counter.h`) counts instructions exactly.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from algos.run_folder import RunError

HARNESS = Path(__file__).with_name("harness")
HARNESS_SOURCES = ("startup.c", "semihosting.c", "uart.c", "counter.c")
LINKER_SCRIPT = HARNESS / "stm32f405.ld"
CPU_FLAGS = ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16")
WARNING_FLAGS = ("-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic")
CC = "arm-none-eabi-gcc"
QEMU = "qemu-system-arm"
QEMU_MACHINE = "netduinoplus2"
_PACKAGES = "gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"


class ToolchainError(RunError):
    """A missing cross compiler or emulator, or a build that failed."""


def require_tool(name: str) -> str:
    """The path of `name` on PATH, or ToolchainError naming the Debian packages that provide it."""
    path = shutil.which(name)
    if path is None:
        raise ToolchainError(
            f"{name} not found on PATH: install the Debian packages {_PACKAGES} "
            "(apt-get install -y --no-install-recommends ...)"
        )
    return path


def toolchain_available() -> bool:
    return all(shutil.which(t) for t in (CC, f"{CC[:-3]}size", "arm-none-eabi-objdump", QEMU))


def compile_elf(
    sources: Iterable[str | Path],
    out_elf: str | Path,
    include_dirs: Sequence[str | Path] = (),
    defines: Mapping[str, str | int | None] | None = None,
    opt: str = "-O3",
    harness: bool = True,
    extra_flags: Sequence[str] = (),
    strict: bool = True,
) -> Path:
    """Compiles and links `sources` (+ the harness sources unless `harness=False`) into `out_elf`.

    Warnings are errors (`-std=c99 -Wall -Wextra -Werror -pedantic`; `strict=False`: plain
    `-std=gnu99`, for third-party code such as the benchmark's peer); sections are garbage
    collected; newlib-nano and libm are linked, no C start files (the harness's reset handler runs
    `main`, whose return value is the semihosting exit status). ToolchainError on failure, with
    the compiler's message.
    """
    cc = require_tool(CC)
    out_elf = Path(out_elf)
    out_elf.parent.mkdir(parents=True, exist_ok=True)
    srcs = [str(s) for s in sources]
    if harness:
        srcs += [str(HARNESS / s) for s in HARNESS_SOURCES]
    defs = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in (defines or {}).items()]
    incs = [f"-I{d}" for d in (*include_dirs, HARNESS)]
    cmd = [
        cc,
        *CPU_FLAGS,
        *(WARNING_FLAGS if strict else ("-std=gnu99",)),
        opt,
        "-g",
        "-ffunction-sections",
        "-fdata-sections",
        *extra_flags,
        *defs,
        *incs,
        *srcs,
        f"-T{LINKER_SCRIPT}",
        "-nostartfiles",
        "--specs=nano.specs",
        "-Wl,--gc-sections",
        "-lm",
        "-o",
        str(out_elf),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"{CC} failed for {out_elf.name}: {_first_lines(proc.stderr)}")
    return out_elf


def size(elf: str | Path) -> dict[str, int]:
    """`arm-none-eabi-size -A` of an ELF or object: text (code and constants), data, bss (bytes);
    flash = text + data (the initial values of .data live in flash), ram = data + bss (the stack
    is not included)."""
    tool = require_tool("arm-none-eabi-size")
    proc = subprocess.run([tool, "-A", str(elf)], capture_output=True, text=True, check=True)
    sections = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            sections[parts[0]] = int(parts[1])
    flash_prefixes = (".isr_vector", ".text", ".rodata", ".ARM.exidx")
    text = sum(n for s, n in sections.items() if s.startswith(flash_prefixes))
    data = sum(n for s, n in sections.items() if s.startswith(".data"))
    bss = sum(n for s, n in sections.items() if s.startswith((".bss", "COMMON")))
    return {"text": text, "data": data, "bss": bss, "flash": text + data, "ram": data + bss}


def qemu_command(
    elf: str | Path,
    semihosting_log: str | Path,
    serial: str | None = None,
    icount: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `qemu-system-arm` command line that `run_qemu` uses, for callers that drive the process
    themselves (e.g. over `-serial tcp:...`). The guest's semihosting console goes to the file
    `semihosting_log` (QEMU's own default is its stderr, mixed with its warnings)."""
    return [
        require_tool(QEMU),
        "-M",
        QEMU_MACHINE,
        "-nographic",
        "-monitor",
        "none",
        "-serial",
        serial or "null",
        "-chardev",
        f"file,id=semihosting,path={semihosting_log}",
        "-semihosting-config",
        "enable=on,target=native,chardev=semihosting",
        *(["-icount", "shift=0"] if icount else []),
        *extra_args,
        "-kernel",
        str(elf),
    ]


def run_qemu(
    elf: str | Path,
    timeout: float = 60.0,
    serial: str | None = None,
    icount: bool = True,
    extra_args: Sequence[str] = (),
) -> tuple[int, str]:
    """Runs `elf` on the emulated STM32F405 until it exits through semihosting.

    `serial`: a QEMU `-serial` spec for USART1 (`pty`, `tcp:127.0.0.1:PORT,server=on,...`), None
    for none. Returns (exit status, semihosting console text). ToolchainError when QEMU is missing
    or the run exceeds `timeout` seconds.
    """
    with tempfile.TemporaryDirectory(prefix="hoverfly-qemu-") as tmp:
        log = Path(tmp) / "semihosting.txt"
        cmd = qemu_command(elf, log, serial, icount, extra_args)
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as e:
            raise ToolchainError(
                f"{Path(elf).name} did not exit within {timeout:g} s in QEMU"
            ) from e
        text = log.read_text(errors="replace") if log.exists() else ""
    if proc.returncode != 0 and not text and proc.stderr.strip():
        raise ToolchainError(f"{QEMU} failed for {Path(elf).name}: {_first_lines(proc.stderr)}")
    return proc.returncode, text


def _first_lines(text: str, n: int = 8) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[:n]) or "(no output)"


def compile_host(
    sources: Iterable[str | Path],
    out_exe: str | Path,
    include_dirs: Sequence[str | Path] = (),
    opt: str = "-O2",
) -> Path:
    """Compiles `sources` with the host's `cc` (warnings are errors, C99, libm)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ToolchainError("no host C compiler (cc/gcc) on PATH: install the Debian package gcc")
    out_exe = Path(out_exe)
    out_exe.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cc, *WARNING_FLAGS, opt, *(f"-I{d}" for d in include_dirs), *map(str, sources)]
    proc = subprocess.run([*cmd, "-lm", "-o", str(out_exe)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"host cc failed for {out_exe.name}: {_first_lines(proc.stderr)}")
    return out_exe
