"""Inference cost of the generated C on the Crazyflie's MCU model (STM32F405, Cortex-M4F 168 MHz),
ours (float32, int8) against the emlearn 0.23.2 peer, under one harness (one JSON object).

Networks: the reference 18→64→64→4 tanh MLP of `shared/reference/embedded.md` (5,504 MACs,
seeded random weights, no action history) and our shipped policy (`tests/data/hover_run`,
50→64→64→4: 18 state values + 8 past actions). Each variant is compiled with arm-none-eabi-gcc
-O3 for `-mcpu=cortex-m4 -mfpu=fpv4-sp-d16 -mfloat-abi=hard` into the bare-metal bench of
`firmware_export/harness/bench_main.c` and run under `qemu-system-arm -M netduinoplus2 -icount
shift=0`:
  instructions  exact, per `policy_control` call (TIM2 counter, average of 100 calls minus an
                empty call of the same signature);
  cycles, µs    the Cortex-M4 model of `firmware_export/cycles.py` (per-class TRM timings on the
                executed-instruction trace; lo/mid/hi; flash wait states excluded) at 168 MHz;
                `instruction_floor_us` = instructions / 168 MHz;
  flash, ram    `arm-none-eabi-size` of the policy's own object file (code + constants; .data +
                .bss), plus `stack_bound` (sum of its functions' frames, -fstack-usage).
Ours includes the observation normalizer, the action history and the output clip; the peer
(emlearn's "loadable" `eml_net_regress`, float, newlib `tanhf`) runs the bare MLP on an
already-normalized input, so the comparison favours it slightly.

    python benchmarks/firmware_inference.py                       # writes the default --out
    python benchmarks/firmware_inference.py --out /tmp/fw.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algos.run_folder import atomic_write, load_run  # noqa: E402
from deploy.policy import DensePolicy, policy_from_run, record_rollouts  # noqa: E402
from deploy.quantize import calibrate_int8  # noqa: E402
from firmware_export import build, codegen  # noqa: E402
from firmware_export.export import target_check  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "firmware_inference_cpu.json"
HOVER_RUN = ROOT / "tests" / "data" / "hover_run"
TARGETS = {"int8_us": 40.0, "f32_us": 150.0, "int8_flash_bytes": 32 * 1024, "ram_bytes": 8 * 1024}
PEER = "emlearn"
PEER_VERSION = "0.23.2"


def reference_policy(seed: int = 0) -> DensePolicy:
    """18→64→64→4 tanh MLP, He-like random weights (seeded), identity normalizer, no history."""
    rng = np.random.default_rng(seed)
    sizes = [18, 64, 64, 4]
    pairs = list(zip(sizes[:-1], sizes[1:], strict=True))
    return DensePolicy(
        weights=tuple((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in pairs),
        biases=tuple((0.1 * rng.standard_normal(b)).astype(np.float32) for _, b in pairs),
        activation="tanh",
        obs_mean=np.zeros(18, np.float32),
        obs_std=np.ones(18, np.float32),
        obs_clip=10.0,
        state_size=18,
        action_history=0,
        hover_action=0.0,
        metadata={"config_hash": "reference-18-64-64-4"},
    )


def layer_sizes(policy: DensePolicy) -> str:
    """ "50_64_64_4": input, hidden and output widths of the policy's MLP."""
    return "_".join(
        str(n) for n in [policy.weights[0].shape[0], *(w.shape[1] for w in policy.weights)]
    )


def measure(files: dict[str, str], work: Path, **kw) -> dict:
    """Writes `files` to a folder and runs `target_check` (bench, trace, sizes) on it."""
    src = work / "src"
    src.mkdir(parents=True)
    for name, text in files.items():
        (src / name).write_text(text)
    r = target_check(src, work, **kw)
    if r["qemu_exit_status"] != 0 or r["self_test_failures"] != 0:
        raise RuntimeError(f"self-test failed under QEMU: {r}")
    size = r["policy_object"]
    return {
        "instructions_per_call": r["instructions_per_call"],
        "cycles_per_call": r["cycles_per_call"],
        "us_per_call_at_168mhz": r["us_per_call_at_168mhz"],
        "instruction_floor_us": r["instruction_floor_us"],
        "flash_bytes": size["flash"],
        "ram_bytes": size["ram"],
        "stack_bound_bytes": size["stack_bound"],
        "instruction_mix": r["instruction_mix"],
    }


def peer_files(policy: DensePolicy, header: str, rng: np.random.Generator) -> dict[str, str]:
    """emlearn's C for the same MLP behind our policy.h API (state + zero history in, action
    out), with a self-test against the numpy MLP (tolerance 1e-3: emlearn prints weights with 6
    decimals)."""
    import emlearn.net

    acts = [policy.activation] * (len(policy.weights) - 1) + ["identity"]
    code = emlearn.net.c_generate_net_loadable(acts, policy.weights, policy.biases, prefix="peer")
    x = rng.standard_normal((4, policy.obs_size)).astype(np.float32)
    x[:, policy.state_size :] = 0.0
    y = x
    for i, (w, b) in enumerate(zip(policy.weights, policy.biases, strict=True)):
        y = y @ w + b
        y = np.tanh(y) if i < len(policy.weights) - 1 else y

    def arr(a):
        return "{" + ", ".join(f"{{{', '.join(f'{v:.9g}f' for v in row)}}}" for row in a) + "}"

    adapter = f"""
#include "policy.h"
static const float test_in[4][POLICY_STATE_SIZE] = {arr(x[:, : policy.state_size])};
static const float test_out[4][POLICY_ACTION_SIZE] = {arr(y)};
void policy_init(void) {{}}
void policy_reset(void) {{}}
void policy_evaluate(const float state[POLICY_STATE_SIZE], float action[POLICY_ACTION_SIZE]) {{
  float in[POLICY_OBS_SIZE] = {{0}};
  for (int i = 0; i < POLICY_STATE_SIZE; i++) in[i] = state[i];
  peer_regress(in, POLICY_OBS_SIZE, action, POLICY_ACTION_SIZE);
}}
void policy_push_action(const float action[POLICY_ACTION_SIZE]) {{ (void)action; }}
void policy_control(const float state[POLICY_STATE_SIZE], float action[POLICY_ACTION_SIZE]) {{
  policy_evaluate(state, action);
}}
int policy_test(void) {{
  int failures = 0;
  for (int t = 0; t < 4; t++) {{
    float a[POLICY_ACTION_SIZE];
    policy_evaluate(test_in[t], a);
    for (int j = 0; j < POLICY_ACTION_SIZE; j++) {{
      float d = a[j] - test_out[t][j];
      if (!(d <= 1e-3f && d >= -1e-3f)) failures++;
    }}
  }}
  return failures;
}}
"""
    return {"policy.h": header, "policy.c": code + adapter}


def bench_network(name: str, policy: DensePolicy, calibration: np.ndarray, tmp: Path) -> dict:
    import emlearn

    console = Console(stderr=True)
    out: dict = {"layers": [list(w.shape) for w in policy.weights], "macs": policy.macs}
    variants = {
        "ours_f32": lambda: codegen.generate_c(policy),
        "ours_int8": lambda: codegen.generate_c(calibrate_int8(policy, calibration)),
    }
    for key, make in variants.items():
        with console.status(f"{name}: {key}"):
            out[key] = measure(make(), tmp / name / key)
    with console.status(f"{name}: {PEER}"):
        files = peer_files(policy, variants["ours_f32"]()["policy.h"], np.random.default_rng(1))
        peer_inc = (Path(emlearn.__file__).parent,)
        out[f"{PEER}_f32"] = measure(files, tmp / name / PEER, include_dirs=peer_inc, strict=False)
    mid = {k: v["cycles_per_call"]["mid"] for k, v in out.items() if isinstance(v, dict)}
    out["ratios"] = {
        "peer_over_ours_f32_cycles": mid[f"{PEER}_f32"] / mid["ours_f32"],
        "peer_over_ours_int8_cycles": mid[f"{PEER}_f32"] / mid["ours_int8"],
        "ours_f32_over_int8_cycles": mid["ours_f32"] / mid["ours_int8"],
        "peer_over_ours_f32_instructions": out[f"{PEER}_f32"]["instructions_per_call"]
        / out["ours_f32"]["instructions_per_call"],
    }
    f32, i8 = out["ours_f32"], out["ours_int8"]
    out["meets_targets"] = {
        "int8_us_mid": i8["us_per_call_at_168mhz"]["mid"] <= TARGETS["int8_us"],
        "f32_us_mid": f32["us_per_call_at_168mhz"]["mid"] <= TARGETS["f32_us"],
        "int8_flash": i8["flash_bytes"] <= TARGETS["int8_flash_bytes"],
        "int8_ram_with_stack": i8["ram_bytes"] + i8["stack_bound_bytes"] <= TARGETS["ram_bytes"],
        "f32_ram_with_stack": f32["ram_bytes"] + f32["stack_bound_bytes"] <= TARGETS["ram_bytes"],
    }
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    p.add_argument("--run", type=Path, default=HOVER_RUN, help="run folder of the shipped policy")
    args = p.parse_args(argv)
    if not build.toolchain_available():
        raise SystemExit("needs arm-none-eabi-gcc, newlib and qemu-system-arm (see README)")
    rng = np.random.default_rng(0)
    ref = reference_policy()
    run = load_run(args.run)
    hover = policy_from_run(run)
    hover_cal = record_rollouts(run, 16, jax.random.key(1))["obs"]
    versions = subprocess.run([build.CC, "--version"], capture_output=True, text=True).stdout
    qemu = subprocess.run([build.QEMU, "--version"], capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory(prefix="hoverfly-fw-bench-") as tmp:
        networks = {
            "reference_18_64_64_4": bench_network(
                "reference", ref, rng.standard_normal((4096, 18)).astype(np.float32), Path(tmp)
            ),
            f"hover_policy_{layer_sizes(hover)}": bench_network(
                "hover", hover, hover_cal, Path(tmp)
            ),
        }
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": "QEMU netduinoplus2 (STM32F405 model), -icount shift=0",
        "compiler": versions.splitlines()[0],
        "qemu": qemu.splitlines()[0],
        "flags": " ".join([*build.CPU_FLAGS, "-O3", "-ffunction-sections", "-fdata-sections"]),
        "clock_hz": 168e6,
        "cycle_model": "firmware_export/cycles.py: Cortex-M4 TRM per-class cycles on the executed "
        "instruction trace; lo/mid/hi; flash wait states excluded",
        "peer": f"{PEER} {PEER_VERSION} (PyPI), c_generate_net_loadable + eml_net_regress",
        "ours_includes": "normalizer, action history, output clip",
        "peer_includes": "bare MLP on a normalized input",
        "targets": TARGETS,
        "hover_run_config_hash": hover.metadata["config_hash"],
        "networks": networks,
    }
    text = json.dumps(report, indent=1)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, text + "\n")
    return report


if __name__ == "__main__":
    main()
