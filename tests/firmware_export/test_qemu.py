"""`export_firmware` end to end: Cortex-M4 build (warnings as errors), self-test under QEMU's
STM32F405, instruction count and cycle model, sizes against the targets, parity, bad input."""

from __future__ import annotations

import json

import pytest

from algos.run_folder import RunError
from firmware_export import build, export_firmware
from firmware_export.export import FORMAT, REPORT

pytestmark = pytest.mark.xdist_group("qemu")  # `exports` builds once (-n 2)

needs_toolchain = pytest.mark.skipif(
    not build.toolchain_available(),
    reason="arm-none-eabi-gcc/qemu-system-arm missing (Debian: gcc-arm-none-eabi "
    "libnewlib-arm-none-eabi qemu-system-arm)",
)


@pytest.fixture(scope="module")
def exports(hover_run, tmp_path_factory):
    if not build.toolchain_available():
        pytest.skip("Cortex-M toolchain missing")
    root = tmp_path_factory.mktemp("firmware")
    return {
        p: (export_firmware(hover_run, root / p, precision=p), root / p) for p in ("f32", "int8")
    }


@needs_toolchain
@pytest.mark.parametrize("precision", ["f32", "int8"])
def test_export_runs_on_stm32f405(exports, precision):
    report, out = exports[precision]
    assert sorted(p.name for p in out.iterdir()) == ["firmware.json", "policy.c", "policy.h"]
    assert json.loads((out / REPORT).read_text()) == report
    host, target = report["host"], report["stm32f405"]
    assert host["self_test_failures"] == 0
    assert target["qemu_exit_status"] == 0 and target["self_test_failures"] == 0
    # The trace's instructions per call match the on-target counter's.
    mix_total = sum(target["instruction_mix"].values())
    assert abs(mix_total - target["instructions_per_call"]) / mix_total < 0.01
    us = target["us_per_call_at_168mhz"]
    assert target["instruction_floor_us"] <= us["lo"] <= us["mid"] <= us["hi"]
    size = target["policy_object"]
    assert size["ram"] + size["stack_bound"] <= 8 * 1024
    if precision == "f32":
        assert host["max_abs_vs_float_reference"] <= 2e-5
        assert host["max_abs_vs_onnxruntime_fp32"] <= 2e-5
    else:
        assert size["flash"] <= 32 * 1024
        assert host["max_abs_vs_int8_reference"] <= 0.01
        # Quantization error: the C is as good as deploy.quantize's reference (whose rare
        # outliers come from held-out states outside the calibrated ranges), typically small.
        scheme = host["int8_reference_max_abs_vs_float_reference"]
        assert host["max_abs_vs_float_reference"] <= scheme + 0.01
        p99 = host["int8_reference_p99_abs_vs_float_reference"]
        assert host["p99_abs_vs_float_reference"] <= p99 + 0.005 and p99 < 0.2
        # int8 is the cheaper one.
        f32 = exports["f32"][0]["stm32f405"]
        assert target["cycles_per_call"]["mid"] < 0.7 * f32["cycles_per_call"]["mid"]
        assert size["flash"] < exports["f32"][0]["stm32f405"]["policy_object"]["flash"]


@needs_toolchain
def test_failed_export_leaves_previous(exports, hover_run):
    _, out = exports["f32"]
    (out / "stale.txt").write_text("left over")
    with pytest.raises(RunError, match="unknown target"):  # checked before any work
        export_firmware(hover_run, out, target="esp32")
    assert (out / "stale.txt").exists()


def test_bad_input(hover_run, tmp_path):
    with pytest.raises(RunError, match="unknown target 'esp32'"):
        export_firmware(hover_run, tmp_path / "a", target="esp32")
    with pytest.raises(RunError, match="unknown precision 'fp16'"):
        export_firmware(hover_run, tmp_path / "a", precision="fp16")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not a previous firmware export"):
        export_firmware(hover_run, busy)
    (busy / REPORT).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(RunError, match="not a previous firmware export"):
        export_firmware(hover_run, busy)
    with pytest.raises(RunError, match="does not exist"):
        export_firmware(tmp_path / "no_run", tmp_path / "b")
    assert FORMAT.startswith("hoverfly-firmware/")
