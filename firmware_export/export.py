"""`export_firmware`: a run folder → dependency-free C (`policy.h`, `policy.c`) plus a report.

Steps: load the run's deterministic actor; record a calibration set (int8 only) and a held-out
set of closed-loop observations of the JAX policy (`record_rollouts`, seeded); generate the C with
an example sequence (states of a held-out episode) that `policy_test()` replays; compile it for
the host (warnings as errors) and compare its actions on the held-out set with the numpy
references and ONNX Runtime; when the Cortex-M toolchain is installed, build it for the target
with the bare-metal harness and run the bench under QEMU (self-test status, instructions per
`policy_control`, cycle estimate from the instruction mix, sizes). Files go to a temp folder that
is renamed to `out_dir` at the end; `firmware.json` in it holds the report.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from rich.console import Console

from algos.run_folder import RunError, load_run
from deploy.onnx_export import make_session
from deploy.onnx_graph import INPUT, OUTPUT, build_model
from deploy.policy import DensePolicy, forward, policy_from_run, record_rollouts
from deploy.quantize import Int8Policy, calibrate_int8, int8_forward
from firmware_export import build, codegen, cycles

PRECISIONS = ("f32", "int8")
TARGETS = ("stm32f405", "host")
FORMAT = "hoverfly-firmware/1"
REPORT = "firmware.json"
ROLLOUT_EPISODES = 16
"""Episodes of each recorded set (calibration, held-out)."""
ROLLOUT_SEEDS = {"calibration": 1, "held_out": 2}
EXAMPLE_STEPS = 10
TRACE_CALLS = 3
"""policy_control calls in the instruction-mix trace (the bench itself times 100)."""


def export_firmware(
    run_dir: str | Path,
    out_dir: str | Path,
    target: str = "stm32f405",
    precision: str = "f32",
    console: Console | None = None,
) -> dict[str, Any]:
    """Writes `policy.h`, `policy.c` and `firmware.json` (the returned report) to `out_dir`.

    target: "stm32f405" (Crazyflie 2.x MCU; QEMU checks when the toolchain exists) or "host".
    RunError on a bad run folder, target, precision, or an `out_dir` that is a non-empty folder
    other than a previous export.
    """
    console = console or Console(stderr=True)
    if target not in TARGETS:
        raise RunError(f"unknown target {target!r} (supported: {', '.join(TARGETS)})")
    if precision not in PRECISIONS:
        raise RunError(f"unknown precision {precision!r} (supported: {', '.join(PRECISIONS)})")
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    run = load_run(Path(run_dir))
    policy = policy_from_run(run)
    with console.status("recording held-out rollouts of the JAX policy"):
        held = record_rollouts(run, ROLLOUT_EPISODES, jax.random.key(ROLLOUT_SEEDS["held_out"]))
    artifact: DensePolicy | Int8Policy = policy
    if precision == "int8":
        with console.status("calibrating int8 on recorded rollouts"):
            key = jax.random.key(ROLLOUT_SEEDS["calibration"])
            calibration = record_rollouts(run, ROLLOUT_EPISODES, key)["obs"]
            artifact = calibrate_int8(policy, calibration)
    states = held["episode_obs"][:EXAMPLE_STEPS, 0, : policy.state_size]
    source = f"run {Path(run_dir).resolve().name}, config {policy.metadata['config_hash']}"
    files = codegen.generate_c(artifact, example_inputs=states, source=source)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".firmware-", dir=out_dir.parent) as tmp:
        stage, work = Path(tmp) / "out", Path(tmp) / "build"
        stage.mkdir()
        for name, text in files.items():
            (stage / name).write_text(text)
        report = {
            "format": FORMAT,
            "run": str(Path(run_dir).resolve()),
            "config_hash": policy.metadata["config_hash"],
            "target": target,
            "precision": precision,
            "files": sorted([*files, REPORT]),
            "network": {
                "layers": [list(w.shape) for w in policy.weights],
                "activation": policy.activation,
                "macs": policy.macs,
                "action_history": policy.action_history,
            },
            "self_test_tolerance": _tolerance(precision),
        }
        with console.status("host build and parity"):
            report["host"] = host_check(stage, work, policy, artifact, held["obs"])
        if target == "stm32f405":
            if build.toolchain_available():
                with console.status("Cortex-M4 build, QEMU self-test and bench"):
                    report["stm32f405"] = target_check(stage, work)
            else:
                report["stm32f405"] = {"skipped": "arm-none-eabi-gcc / qemu-system-arm missing"}
        (stage / REPORT).write_text(json.dumps(report, indent=1) + "\n")
        _replace_dir(stage, out_dir)
    return report


def host_check(
    src: Path,
    work: Path,
    policy: DensePolicy,
    artifact: DensePolicy | Int8Policy,
    obs: np.ndarray,
) -> dict[str, Any]:
    """Host-compiled self-test status and max |Δaction| on `obs` [N, obs] against the float
    reference (`forward`), ONNX Runtime fp32, and for int8 `int8_forward` (plus the 99th
    percentile against float, and int8_forward's own max error: the scheme's outliers)."""
    exe = compile_host_driver(src, work / "host_policy")
    status = subprocess.run([exe, "test"], capture_output=True).returncode
    actions = host_actions(exe, obs)
    onnx_fp32 = make_session(build_model(policy, "fp32").SerializeToString())
    ort_actions = onnx_fp32.run([OUTPUT], {INPUT: np.asarray(obs, np.float32)})[0]
    out = {
        "self_test_failures": status,
        "held_out_samples": len(obs),
        "max_abs_vs_float_reference": _max_diff(actions, forward(policy, obs)),
        "max_abs_vs_onnxruntime_fp32": _max_diff(actions, ort_actions),
    }
    if isinstance(artifact, Int8Policy):
        ref8, ref = int8_forward(artifact, obs), forward(policy, obs)
        out["max_abs_vs_int8_reference"] = _max_diff(actions, ref8)
        out["p99_abs_vs_float_reference"] = float(np.quantile(np.abs(actions - ref), 0.99))
        out["int8_reference_max_abs_vs_float_reference"] = _max_diff(ref8, ref)
        out["int8_reference_p99_abs_vs_float_reference"] = float(
            np.quantile(np.abs(ref8 - ref), 0.99)
        )
    return out


def target_check(
    src: Path, work: Path, include_dirs: tuple[Path, ...] = (), strict: bool = True
) -> dict[str, Any]:
    """Cortex-M4 build of `src`/policy.c with the bench under QEMU: self-test status,
    instructions per policy_control (exact), cycle/µs estimate (`cycles` model), sizes of the
    policy object and the bench image. `strict=False` drops -Werror (third-party code)."""
    sources = [src / "policy.c", build.HARNESS / "bench_main.c"]
    incs = [src, *include_dirs]
    bench = build.compile_elf(sources, work / "bench.elf", include_dirs=incs, strict=strict)
    status, text = build.run_qemu(bench)
    line = parse_bench(text)
    trace_elf = build.compile_elf(
        sources,
        work / "trace.elf",
        include_dirs=incs,
        defines={"BENCH_CALLS": TRACE_CALLS},
        strict=strict,
    )
    mix = cycles.trace_mix(trace_elf, TRACE_CALLS)
    per_call = (line["control"] - line["empty"]) / line["calls"]
    policy_size = object_size(src / "policy.c", work, incs, strict)
    return {
        "qemu_exit_status": status,
        "self_test_failures": line["failures"],
        "instructions_per_call": per_call,
        "cycles_per_call": mix["cycles"],
        "us_per_call_at_168mhz": mix["us"],
        "instruction_floor_us": per_call / cycles.CLOCK_HZ * 1e6,
        "instruction_mix": mix["mix"],
        "cycle_model": "Cortex-M4 TRM per-class timings on QEMU's executed-instruction trace "
        "(firmware_export/cycles.py); flash wait states not included",
        "policy_object": policy_size,
        "bench_image": build.size(bench),
    }


def compile_host_driver(src: Path, exe: Path) -> Path:
    """The host test driver (`harness/host_main.c`) linked with the generated policy in `src`."""
    sources = [src / "policy.c", build.HARNESS / "host_main.c"]
    return build.compile_host(sources, exe, include_dirs=[src])


def host_actions(exe: Path, obs: np.ndarray, mode: str = "obs") -> np.ndarray:
    """Runs the host driver: mode "obs" evaluates each observation [N, obs] (history set through
    the API), "episode" runs policy_control over the rows' states after setting the history of
    the first row. Returns actions [N, 4] float32."""
    data = np.ascontiguousarray(obs, np.float32).tobytes()
    proc = subprocess.run([exe, mode], input=data, capture_output=True, check=True)
    return np.frombuffer(proc.stdout, np.float32).reshape(-1, 4)


def parse_bench(text: str) -> dict[str, int]:
    """The bench's `BENCH failures=.. calls=.. control=.. empty=..` line as ints."""
    m = re.search(r"BENCH failures=(\d+) calls=(\d+) control=(\d+) empty=(\d+)", text)
    if not m:
        raise build.ToolchainError(f"no BENCH line in the QEMU output: {text.strip()[:200]!r}")
    return dict(zip(("failures", "calls", "control", "empty"), map(int, m.groups()), strict=True))


def object_size(
    source: Path, work: Path, include_dirs: list[Path] | None = None, strict: bool = True
) -> dict[str, int]:
    """Sizes of one compiled C file for the target (flash = text + data, ram = data + bss) and
    its worst-case stack: the sum of the frames of its functions (GCC -fstack-usage)."""
    obj = work / (source.stem + ".o")
    flags = build.WARNING_FLAGS if strict else ("-std=gnu99",)
    cmd = [build.require_tool(build.CC), *build.CPU_FLAGS, *flags, "-O3"]
    cmd += [f"-I{d}" for d in include_dirs or ()]
    cmd += ["-fstack-usage", "-c", str(source), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    if proc.returncode != 0:
        raise build.ToolchainError(f"{build.CC} failed for {source.name}: {proc.stderr[:300]}")
    sizes = build.size(obj)
    frames = obj.with_suffix(".su").read_text().splitlines()
    sizes["stack_bound"] = sum(int(line.split("\t")[1]) for line in frames if "\t" in line)
    return sizes


def _tolerance(precision: str) -> str:
    if precision == "f32":
        return f"|Δaction| ≤ {codegen.F32_TOLERANCE:g} against deploy.policy.forward"
    return f"|Δaction| ≤ {codegen.INT8_TOLERANCE:g} against firmware_export.int8_model.forward"


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise RunError(f"{out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not _is_export(out_dir):
        raise RunError(
            f"{out_dir}: a non-empty folder that is not a previous firmware export "
            f"(no {REPORT} of format {FORMAT}); choose another output folder"
        )


def _is_export(folder: Path) -> bool:
    try:
        return json.loads((folder / REPORT).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _replace_dir(stage: Path, out_dir: Path) -> None:
    """Moves `stage` to `out_dir`, replacing a previous export (renames, no partial state)."""
    old = stage.parent / "previous"
    if out_dir.exists():
        out_dir.rename(old)
    stage.rename(out_dir)
    if old.exists():
        shutil.rmtree(old)
