"""ONNX export of a trained run at fp32, fp16, int8 (QDQ) or fp8 (E4M3FN QDQ), with checks.

`export_onnx(run_dir, out, precision)` rebuilds the deterministic actor from the run folder,
records a held-out set (and, for int8/fp8, a calibration set) of closed-loop observations of
the JAX policy (`PARITY_EPISODES` episodes each, `record_rollouts` keys `PARITY_SEEDS`), quantizes
on the calibration set (int8: `deploy.quantize`; fp8: `deploy.onnx_graph`), builds the graph
(`deploy.onnx_graph.build_model`, opset 21, one self-contained file), runs it in ONNX Runtime on
the held-out set (max |Δaction| against the JAX policy and the numpy references) and flies it in
the simulator next to the float JAX policy under the run's eval protocol. A variant whose success
rate falls more than `MAX_SUCCESS_DROP_POINTS` points below float is refused (`ExportRefused`, no
file written) unless `force`; otherwise the file is written atomically. The rule is meant for the
protocol's 1000 episodes: there, float-equivalent implementations (JAX, numpy, ONNX fp32) differ
by ≤ 0.3 points because a few borderline episodes flip under 1e-7 action differences; with n
episodes one episode is 100/n points, so a small n can refuse even an exact export.

Metadata (`model.metadata_props`; every value is a JSON document, `read_metadata` parses them):
  hoverfly.format        "hoverfly-onnx/1"
  hoverfly.policy        `DensePolicy.metadata`: observation layout (name, offset, size, frame,
                         units, meaning per field), action (motor order, range, rpm mapping,
                         hover action), control_rate_hz, action_history, action_delay_steps,
                         parameter_set, config_hash, checkpoint_update, activation, hidden
  hoverfly.precision     "fp32" | "fp16" | "int8" | "fp8"
  hoverfly.quantization  null, or {scheme, calibration_percentile, calibration_samples,
                         input_gain [obs] (int8: the first layer's per-feature stretch),
                         input_scales [layer], weight_scales [layer][out]}
  hoverfly.example       {"obs": [[obs_size]], "actions": [[4]]}: held-out inputs and this
                         artifact's outputs, a self-test that any runtime can replay
                         (`load_onnx_policy` does)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np
import onnx
import onnxruntime as ort
from rich.console import Console

from algos.evaluate import eval_steps, rollout, summarize
from algos.run_folder import Run, RunError, atomic_write, load_run
from algos.runner import enable_compilation_cache
from deploy.onnx_graph import (
    INPUT,
    OPSET,
    OUTPUT,
    Fp8Policy,
    build_model,
    calibrate_fp8,
    fp8_forward,
)
from deploy.policy import DensePolicy, closed_loop_eval, forward, policy_from_run, record_rollouts
from deploy.quantize import Int8Policy, calibrate_int8, int8_forward
from policies import make_policy

Precision = Literal["fp32", "fp16", "int8", "fp8"]
PRECISIONS = ("fp32", "fp16", "int8", "fp8")
FORMAT = "hoverfly-onnx/1"
PARITY_EPISODES = 64
"""Episodes of each recorded set (calibration and held-out)."""
PARITY_SEEDS = {"calibration": 1, "held_out": 2}
"""`record_rollouts` keys of the two sets."""
MAX_SUCCESS_DROP_POINTS = 2.0
"""Largest closed-loop success-rate drop below float (percentage points) accepted without force."""
EXAMPLE_ROWS = 4
EXAMPLE_TOLERANCE = 1e-4
"""Max |Δaction| when replaying the embedded example (other CPUs may pick other kernels)."""
_KEYS = ("format", "policy", "precision", "quantization", "example")


class ExportRefused(RunError):
    """The variant flies clearly worse than the float policy (force=True writes it anyway)."""


class OnnxPolicyError(RunError):
    """A file that is not a usable Hoverfly ONNX policy."""


def export_onnx(
    run_dir: Path,
    out: Path,
    precision: Precision = "fp32",
    force: bool = False,
    episodes: int | None = None,
    console: Console | None = None,
    *,
    calibration_percentile: float = 100.0,
    cache_dir: Path | None | Literal["default"] = "default",
) -> dict[str, Any]:
    """Exports the run's policy to the ONNX file `out` and returns a JSON-able report.

    episodes: closed-loop episodes (default: the run's eval protocol). calibration_percentile:
    per-layer input range of the int8/fp8 calibration (< 100 clips outliers). cache_dir: JAX
    persistent compilation cache, as in `algos.runner.evaluate_run`.
    Raises RunError for bad input and `ExportRefused` when the success rate falls more than
    `MAX_SUCCESS_DROP_POINTS` below float and not `force` (nothing is written then).
    """
    out = Path(out)
    if precision not in PRECISIONS:
        raise RunError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    if out.is_dir():
        raise RunError(f"{out} is a directory; give the path of the .onnx file to write")
    if episodes is not None and episodes < 1:
        raise RunError(f"episodes must be ≥ 1, got {episodes}")
    if not 0 < calibration_percentile <= 100:
        raise RunError(f"calibration_percentile must be in (0, 100], got {calibration_percentile}")
    console = console or Console(stderr=True)
    enable_compilation_cache(cache_dir)
    run = load_run(Path(run_dir))
    policy = policy_from_run(run)
    n = run.config.eval.episodes if episodes is None else episodes
    quantized, quantization = _calibrate(run, policy, precision, calibration_percentile, console)
    with console.status(f"recording {PARITY_EPISODES} held-out episodes"):
        held_out = record_parity_set(run, "held_out")
    model = build_model(policy, precision, quantized)
    session = make_session(model.SerializeToString())
    report = _parity(session, policy, quantized, held_out)
    console.print(
        f"{precision}: max |Δaction| {report['max_abs_action_diff']:.3g} vs the JAX policy "
        f"over {report['held_out_samples']:,} held-out observations"
    )
    report |= _closed_loop(run, session, precision, n, console)
    example = held_out["obs"][np.linspace(0, len(held_out["obs"]) - 1, EXAMPLE_ROWS).astype(int)]
    props = {
        "format": FORMAT,
        "policy": policy.metadata,
        "precision": precision,
        "quantization": quantization,
        "example": {"obs": example.tolist(), "actions": _run(session, example).tolist()},
    }
    onnx.helper.set_model_props(model, {f"hoverfly.{k}": json.dumps(v) for k, v in props.items()})
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()
    drop = report["success_drop_points"]
    if drop > MAX_SUCCESS_DROP_POINTS and not force:
        raise ExportRefused(
            f"{precision} export refused: closed-loop success {report['success_rate']:.1%} vs "
            f"{report['float_success_rate']:.1%} for float ({drop:.1f} points lower, limit "
            f"{MAX_SUCCESS_DROP_POINTS:g}); nothing written (force=True writes it anyway)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, data)
    console.print(f"wrote {out} ({len(data):,} bytes)")
    return {
        "path": str(out),
        "precision": precision,
        "bytes": len(data),
        "opset": OPSET,
        **report,
        "calibration_samples": quantization["calibration_samples"] if quantization else 0,
        "forced": drop > MAX_SUCCESS_DROP_POINTS,
        "config_hash": policy.metadata["config_hash"],
    }


def record_parity_set(run: Run, kind: Literal["calibration", "held_out"]) -> dict[str, np.ndarray]:
    """`record_rollouts` of the JAX policy: `PARITY_EPISODES` episodes, key `PARITY_SEEDS[kind]`."""
    return record_rollouts(run, PARITY_EPISODES, jax.random.key(PARITY_SEEDS[kind]))


def quantize_policy(
    policy: DensePolicy, precision: str, calibration_obs: np.ndarray, percentile: float = 100.0
) -> Int8Policy | Fp8Policy | None:
    """The calibrated int8/fp8 policy of `precision`; None for fp32 and fp16."""
    if precision == "int8":
        return calibrate_int8(policy, calibration_obs, percentile)
    if precision == "fp8":
        return calibrate_fp8(policy, calibration_obs, percentile)
    return None


def quantized_forward(q: Int8Policy | Fp8Policy, obs: np.ndarray) -> np.ndarray:
    """The numpy reference of a quantized policy: obs [N, obs] → actions [N, 4]."""
    return int8_forward(q, obs) if isinstance(q, Int8Policy) else fp8_forward(q, obs)


def make_session(model: bytes | str) -> ort.InferenceSession:
    """A single-threaded CPU ONNX Runtime session (a policy-sized MLP gains nothing from more).

    `session.x64quantprecision` makes ORT's fused int8 matmul exact on x86 CPUs without VNNI: by
    default it runs u8·s8 with AVX2's `vpmaddubsw`, whose int16 pair sums saturate (measured on
    an AVX2-only AMD EPYC: int8 actions off the scheme's reference by up to 0.33). Anyone running
    an exported int8 model in their own ORT session on such a CPU needs the same entry.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def float_closed_loop_eval(run: Run, episodes: int) -> dict[str, float]:
    """The run's deterministic JAX policy under the protocol (seed, episodes) of
    `closed_loop_eval`. Returns {success_rate, pos_rmse_m, termination_rate, episodes}."""
    cfg = run.config.eval
    steps, settle = eval_steps(cfg, run.env.dt)

    def run_episodes(params, key):
        policy = make_policy(run.network, params, deterministic=True)
        return rollout(run.env, policy, key, episodes, steps)

    traj = jax.jit(run_episodes)(run.params, jax.random.key(cfg.seed))
    return summarize(traj, settle, cfg.tolerance)


def _run(session: ort.InferenceSession, obs: np.ndarray) -> np.ndarray:
    return session.run([OUTPUT], {INPUT: np.asarray(obs, np.float32)})[0]


def _parity(session, policy, quantized, held_out) -> dict[str, Any]:
    """max |Δaction| of the artifact on the held-out set against the JAX policy and references."""
    actions = _run(session, held_out["obs"])
    diff = lambda ref: float(np.abs(actions - ref).max())  # noqa: E731
    return {
        "max_abs_action_diff": diff(held_out["action"]),
        "max_abs_diff_vs_float_reference": diff(forward(policy, held_out["obs"])),
        "max_abs_diff_vs_quantized_reference": (
            None if quantized is None else diff(quantized_forward(quantized, held_out["obs"]))
        ),
        "held_out_samples": int(len(actions)),
    }


def _closed_loop(run, session, precision, episodes, console) -> dict[str, Any]:
    """Closed-loop eval of the artifact and of the float JAX policy on the same episodes."""
    with console.status(f"closed-loop eval of the {precision} ONNX artifact ({episodes} episodes)"):
        ours = closed_loop_eval(run, lambda obs: _run(session, obs), episodes)
    with console.status(f"closed-loop eval of the float policy ({episodes} episodes)"):
        ref = float_closed_loop_eval(run, episodes)
    console.print(
        f"closed loop over {episodes} episodes: success {ours['success_rate']:.1%} "
        f"({precision} ONNX) vs {ref['success_rate']:.1%} (float)"
    )
    return {
        "success_rate": ours["success_rate"],
        "float_success_rate": ref["success_rate"],
        "success_drop_points": round(100.0 * (ref["success_rate"] - ours["success_rate"]), 6),
        "pos_rmse_m": ours["pos_rmse_m"],
        "float_pos_rmse_m": ref["pos_rmse_m"],
        "termination_rate": ours["termination_rate"],
        "episodes": episodes,
    }


def _calibrate(run, policy, precision, percentile, console) -> tuple[Any, dict | None]:
    """(Int8Policy | Fp8Policy, its hoverfly.quantization document), or (None, None) for floats."""
    if precision not in ("int8", "fp8"):
        return None, None
    with console.status(f"recording {PARITY_EPISODES} calibration episodes"):
        obs = record_parity_set(run, "calibration")["obs"]
    q = quantize_policy(policy, precision, obs, percentile)
    scheme = (
        "int8 symmetric QDQ: the normalized observation times a per-feature gain, per-tensor "
        "inputs (zero point 0, clip ±127), per-output-channel weights (axis 1), int32 bias at "
        "s_in·s_w, float activations"
        if precision == "int8"
        else "float8 E4M3FN QDQ: per-tensor inputs (amax/448, saturating), per-output-channel "
        "weights (axis 1), float32 bias, float activations"
    )
    return q, {
        "scheme": scheme,
        "calibration_percentile": percentile,
        "calibration_samples": len(obs),
        **({"input_gain": q.input_gain.tolist()} if precision == "int8" else {}),
        "input_scales": list(q.input_scales),
        "weight_scales": [s.tolist() for s in q.weight_scales],
    }


# -- reading an artifact ----------------------------------------------------------------------
def read_metadata(path: Path) -> dict[str, Any]:
    """The hoverfly.* metadata of an exported file as {format, policy, precision, quantization,
    example} (OnnxPolicyError if the file is not a Hoverfly ONNX policy)."""
    return _metadata(_load_model(Path(path)), Path(path))


@dataclasses.dataclass(frozen=True, eq=False)
class OnnxPolicy:
    """A checked ONNX Runtime session of an exported policy: obs [B, obs_size] → actions [B, 4]."""

    path: Path
    session: ort.InferenceSession
    obs_size: int
    metadata: dict[str, Any]
    """As `read_metadata`."""

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return _run(self.session, np.asarray(obs, np.float32).reshape(-1, self.obs_size))


def load_onnx_policy(path: Path, obs_size: int | None = None) -> OnnxPolicy:
    """Opens an exported policy and validates it: I/O names, dtypes and shapes, the observation
    layout of its metadata (and `obs_size` if given), and a replay of its embedded example."""
    path = Path(path)
    model = _load_model(path)
    metadata = _metadata(model, path)
    try:
        session = make_session(model.SerializeToString())
    except Exception as e:  # ONNX Runtime's exception types share no base class beyond Exception
        raise OnnxPolicyError(f"{path}: ONNX Runtime cannot load it ({_one_line(e)})") from None
    ins, outs = session.get_inputs(), session.get_outputs()
    names = [i.name for i in ins], [o.name for o in outs]
    if names != ([INPUT], [OUTPUT]):
        raise OnnxPolicyError(
            f"{path}: expected input {INPUT!r} and output {OUTPUT!r}, found inputs {names[0]} "
            f"and outputs {names[1]}"
        )
    shapes = ins[0].shape, outs[0].shape
    if (
        {ins[0].type, outs[0].type} != {"tensor(float)"}
        or [len(s) for s in shapes] != [2, 2]
        or not isinstance(shapes[0][1], int)
        or shapes[1][1] != 4
    ):
        raise OnnxPolicyError(
            f"{path}: expected float32 obs [batch, N] → actions [batch, 4], found "
            f"{ins[0].type} {shapes[0]} → {outs[0].type} {shapes[1]}"
        )
    size = shapes[0][1]
    layout = sum(field["size"] for field in metadata["policy"]["observation"])
    for expected, what in ((layout, "its metadata's observation layout"), (obs_size, "the caller")):
        if expected is not None and size != expected:
            raise OnnxPolicyError(f"{path}: obs has size {size}, but {what} expects {expected}")
    policy = OnnxPolicy(path, session, size, metadata)
    example = metadata["example"]
    err = float(np.abs(policy(np.asarray(example["obs"])) - np.asarray(example["actions"])).max())
    if not err <= EXAMPLE_TOLERANCE:
        raise OnnxPolicyError(f"{path}: embedded example replays with |Δaction| {err:.3g}")
    return policy


def _load_model(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise OnnxPolicyError(f"{path}: no such file")
    try:
        model = onnx.load_model_from_string(path.read_bytes())
        onnx.checker.check_model(model)
    except Exception as e:  # protobuf DecodeError, onnx ValidationError, ...
        raise OnnxPolicyError(f"{path} is not a valid ONNX model ({_one_line(e)})") from None
    return model


def _metadata(model: onnx.ModelProto, path: Path) -> dict[str, Any]:
    props = {p.key: p.value for p in model.metadata_props}
    missing = [k for k in _KEYS if f"hoverfly.{k}" not in props]
    if missing:
        raise OnnxPolicyError(f"{path}: not a Hoverfly policy (no hoverfly.{missing[0]} metadata)")
    try:
        doc = {k: json.loads(props[f"hoverfly.{k}"]) for k in _KEYS}
    except json.JSONDecodeError as e:
        raise OnnxPolicyError(f"{path}: hoverfly metadata is not valid JSON ({e})") from None
    if doc["format"] != FORMAT:
        raise OnnxPolicyError(f"{path}: metadata format {doc['format']!r}, expected {FORMAT!r}")
    return doc


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__
