"""The Crazyflie out-of-tree controller app of a policy (see templates/README.md for what it does).

`write_app(policy_or_run_dir, out_dir, precision)` writes a buildable app folder:

  Makefile, Kbuild, app-config, src/Kbuild    the firmware's out-of-tree build (oot.mk)
  src/hoverfly_controller.c                   appMain + the out-of-tree controller (verbatim)
  src/hoverfly_config.h                       this run's constants (hash, rpm_max, rates, clips)
  src/policy.h, src/policy.c                  `firmware_export.codegen.generate_c` (self-contained)
  README.md                                   build, flash and fly instructions
  hoverfly_app.json                           manifest: config hash, precision, rates, sha256s

The folder appears atomically (written beside, then renamed); an existing app folder is replaced,
any other non-empty folder is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from algos.run_folder import RunError, is_empty_dir, load_run
from deploy.crazyflie import APP_MANIFEST, hash_words
from deploy.policy import DensePolicy, policy_from_run, record_rollouts
from deploy.quantize import Int8Policy, calibrate_int8
from firmware_export.codegen import generate_c
from firmware_export.export import ROLLOUT_EPISODES, ROLLOUT_SEEDS

MANIFEST_FORMAT = "hoverfly-crazyflie-app/1"
POLICY_RATE_HZ = 500
"""Policy evaluations per second (every other 1 kHz stabilizer step)."""
DEADMAN_MS = 200
"""The motors stop when the latest setpoint is older than this."""
POSITION_CLIP_M = 0.5
VELOCITY_CLIP_MPS = 2.0
STATIC_FILES = ("Makefile", "Kbuild", "app-config", "src/Kbuild", "src/hoverfly_controller.c")

Precision = Literal["f32", "int8"]


def write_app(
    policy_or_run_dir: DensePolicy | Int8Policy | str | Path,
    out_dir: str | Path,
    precision: Precision = "f32",
) -> dict[str, Any]:
    """Writes the app folder `out_dir` for a policy (a `DensePolicy`, an `Int8Policy`, or a run
    folder whose latest checkpoint is exported; int8 from a `DensePolicy` needs the run folder for
    its calibration rollouts). Returns {dir, config_hash, precision, files, manifest}."""
    if precision not in ("f32", "int8"):
        raise RunError(f"precision must be 'f32' or 'int8', not {precision!r}")
    policy = _resolve(policy_or_run_dir, precision)
    dense = policy.float_policy if isinstance(policy, Int8Policy) else policy
    files = _app_files(policy, dense)
    manifest = _manifest(dense, precision, files)
    files[APP_MANIFEST] = json.dumps(manifest, indent=2) + "\n"
    out = _write_tree(Path(out_dir), files)
    return {
        "dir": str(out),
        "config_hash": manifest["config_hash"],
        "precision": precision,
        "files": sorted(files),
        "manifest": manifest,
    }


def _resolve(source, precision: Precision) -> DensePolicy | Int8Policy:
    """The policy of the requested precision."""
    if isinstance(source, Int8Policy):
        if precision != "int8":
            raise RunError("an Int8Policy exports as precision 'int8'")
        return source
    if isinstance(source, DensePolicy):
        if precision == "int8":
            raise RunError("int8 needs the run folder (calibration rollouts), not a DensePolicy")
        return source
    run = load_run(Path(source))
    dense = policy_from_run(run)
    return dense if precision == "f32" else _calibrate(run, dense)


def _calibrate(run, dense: DensePolicy) -> Int8Policy:
    """The int8 policy `hoverfly firmware-export --precision int8` builds (same rollouts)."""
    key = jax.random.key(ROLLOUT_SEEDS["calibration"])
    return calibrate_int8(dense, record_rollouts(run, ROLLOUT_EPISODES, key)["obs"])


def _app_files(policy, dense: DensePolicy) -> dict[str, str]:
    templates = resources.files(__package__) / "templates"
    files = {name: (templates / name).read_text() for name in STATIC_FILES}
    for name, text in generate_c(policy).items():
        files[f"src/{name}"] = text
    values = _constants(dense)
    files["src/hoverfly_config.h"] = _config_header(values)
    readme = string.Template((templates / "README.md").read_text())
    precision = "int8" if isinstance(policy, Int8Policy) else "float32"
    files["README.md"] = readme.substitute(values, precision=precision)
    return files


def _constants(p: DensePolicy) -> dict[str, Any]:
    """The run-specific values of hoverfly_config.h and the README."""
    config_hash = p.metadata["config_hash"]
    history_rate = float(p.metadata["control_rate_hz"])
    if history_rate != round(history_rate) or POLICY_RATE_HZ % round(history_rate):
        raise RunError(
            f"control rate {history_rate:g} Hz does not divide the app's {POLICY_RATE_HZ} Hz "
            "policy rate (the history must advance on evaluation ticks)"
        )
    hi, lo = hash_words(config_hash)
    return {
        "config_hash": config_hash,
        "hash_hi": f"0x{hi:08X}u",
        "hash_lo": f"0x{lo:08X}u",
        "rpm_max": float(np.float32(p.metadata["action"]["rpm_max"])),
        "policy_rate_hz": POLICY_RATE_HZ,
        "history_rate_hz": round(history_rate),
        "history_period_ms": 1000 // round(history_rate),
        "deadman_ms": DEADMAN_MS,
        "position_clip": POSITION_CLIP_M,
        "velocity_clip": VELOCITY_CLIP_MPS,
    }


def _config_header(v: dict[str, Any]) -> str:
    return f"""\
/* Generated by hoverfly firmware-export for config {v["config_hash"]}; do not edit. */
#ifndef HOVERFLY_CONFIG_H
#define HOVERFLY_CONFIG_H

#define HOVERFLY_CONFIG_HASH "{v["config_hash"]}"
#define HOVERFLY_HASH_HI {v["hash_hi"]} /* parameter hoverfly.hashHi: hash digits 1-8 */
#define HOVERFLY_HASH_LO {v["hash_lo"]} /* parameter hoverfly.hashLo: hash digits 9-16 */
#define HOVERFLY_RPM_MAX {v["rpm_max"]!r}f /* rpm at action +1 (ratio 65535) */
#define HOVERFLY_POLICY_RATE_HZ {v["policy_rate_hz"]} /* policy evaluations */
#define HOVERFLY_HISTORY_RATE_HZ {v["history_rate_hz"]} /* action-history updates */
#define HOVERFLY_DEADMAN_MS {v["deadman_ms"]} /* motors off after this setpoint age */
#define HOVERFLY_POSITION_CLIP_M {v["position_clip"]!r}f
#define HOVERFLY_VELOCITY_CLIP_MPS {v["velocity_clip"]!r}f

#endif
"""


def _manifest(p: DensePolicy, precision: Precision, files: dict[str, str]) -> dict[str, Any]:
    v = _constants(p)
    return {
        "format": MANIFEST_FORMAT,
        "config_hash": v["config_hash"],
        "precision": precision,
        "rpm_max": v["rpm_max"],
        "policy_rate_hz": v["policy_rate_hz"],
        "history_rate_hz": v["history_rate_hz"],
        "deadman_ms": v["deadman_ms"],
        "sha256": {n: hashlib.sha256(t.encode()).hexdigest() for n, t in sorted(files.items())},
    }


def _write_tree(out: Path, files: dict[str, str]) -> Path:
    """Writes `files` into a sibling temp folder, then renames it to `out`."""
    if out.exists() and not (
        (out.is_dir() and is_empty_dir(out)) or (out / APP_MANIFEST).is_file()
    ):
        raise RunError(f"{out} exists and is not a hoverfly app folder: refusing to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, text in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    old = out.with_name(f".{out.name}.{os.getpid()}.old")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out
