"""Firmware export: dependency-free C99 for microcontrollers (float32 and int8) from a run
folder, a bare-metal STM32F405 harness run under QEMU (`netduinoplus2`) with an instruction-exact
counter and a Cortex-M4 cycle model, and (subpackages) a Crazyflie out-of-tree controller app and
a hardware-in-the-loop firmware.

Public API:
- `export_firmware(run_dir, out_dir, target, precision) -> report` (the CLI's entry point);
- `generate_c(policy, example_inputs=...) -> {"policy.h", "policy.c"}` for a `DensePolicy` or an
  `Int8Policy` (the C API is documented in the generated `policy.h`);
- `compile_elf`, `compile_host`, `run_qemu`, `size`, `toolchain_available` (`build`), and
  `trace_mix` (`cycles`) for other firmware images built on the harness.
"""

from firmware_export.build import (
    HARNESS,
    ToolchainError,
    compile_elf,
    compile_host,
    run_qemu,
    size,
    toolchain_available,
)
from firmware_export.codegen import generate_c
from firmware_export.cycles import trace_mix
from firmware_export.export import PRECISIONS, TARGETS, export_firmware

__all__ = [
    "HARNESS",
    "PRECISIONS",
    "TARGETS",
    "ToolchainError",
    "compile_elf",
    "compile_host",
    "export_firmware",
    "generate_c",
    "run_qemu",
    "size",
    "toolchain_available",
    "trace_mix",
]
