"""ONNX graphs of a `DensePolicy`, built with `onnx.helper` (no torch), and the FP8 scheme.

Every graph maps `obs` float32 [batch, obs_size] to `actions` float32 [batch, 4] (dynamic dim
"batch") and bakes in the normalizer and the deterministic head:
x = clip((obs − mean) / std, ±obs_clip); x = act(x·W_i + b_i) for hidden layers;
actions = clip(x·W_last + b_last, −1, 1).

Precisions:
- fp32: the float policy as is.
- fp16: Cast(obs → float16) at the input; normalizer, weights and compute in float16;
  Cast(→ float32) at the output, so that I/O names and dtypes stay those of fp32.
- int8: QDQ with `deploy.quantize`'s scheme. The normalized observation times the per-feature
  input gain (Mul), then before each layer Clip(±127·s_in) →
  QuantizeLinear(s_in, int8 zero point 0) → DequantizeLinear; weights are int8 [in, out]
  initializers through DequantizeLinear with per-output-channel scales (axis 1); the bias is the
  scheme's int32 b_q through DequantizeLinear at the accumulator scale s_in·s_w (axis 0, the QDQ
  convention for biases), added in float; activations in float. The Clip is needed because
  QuantizeLinear saturates int8 at [−128, 127] while the scheme clips at ±127.
- fp8: the same shape with FLOAT8E4M3FN: per-tensor activation scales s_in = amax / 448
  (QuantizeLinear saturates at ±448, rounding half to even), per-output-channel weight scales
  s_w = max_i |W[i, j]| / 448 (ONNX Runtime's CPU DequantizeLinear accepts per-axis float8),
  float32 bias. `calibrate_fp8`/`fp8_forward` are its numpy reference (ml_dtypes rounding). The
  normalizer's clip is Max(Min(x, 10), −10) here: ONNX Runtime 1.32's ClipQuantFusion throws on a
  Clip node feeding a float8 QuantizeLinear.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deploy.policy import ACTIVATIONS_NP, DensePolicy, normalize_obs
from deploy.quantize import QMAX, Int8Policy, layer_inputs

OPSET = 21
IR_VERSION = 10
"""The IR version that goes with opset 21 (onnx.helper.VERSION_TABLE)."""
FP8_MAX = 448.0
"""Largest finite float8 E4M3FN value."""
INPUT, OUTPUT = "obs", "actions"


# -- FP8 (E4M3FN) scheme ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Fp8Policy:
    """A float8 E4M3FN policy: `float_policy` plus per-layer scales and float8 weights."""

    float_policy: DensePolicy
    input_scales: tuple[float, ...]
    """Per layer: per-tensor scale of the layer's float8 input (amax / 448)."""
    weights_q: tuple[np.ndarray, ...]
    """Per layer: float8_e4m3fn [in, out]."""
    weight_scales: tuple[np.ndarray, ...]
    """Per layer: float32 [out], max_i |W[i, j]| / 448."""


def quantize_fp8(x: np.ndarray, scale: float | np.ndarray) -> np.ndarray:
    """x / scale saturated to ±448 and rounded half to even to float8_e4m3fn (QuantizeLinear)."""
    y = np.asarray(x, np.float32) / np.asarray(scale, np.float32)
    return np.clip(y, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)


def calibrate_fp8(
    policy: DensePolicy, calibration_obs: np.ndarray, percentile: float = 100.0
) -> Fp8Policy:
    """Quantizes `policy` to float8 with input ranges from `calibration_obs` [N, obs]."""
    obs = np.asarray(calibration_obs, np.float32).reshape(-1, policy.obs_size)
    if obs.shape[0] == 0 or not np.all(np.isfinite(obs)):
        raise ValueError("calibration observations must be a non-empty finite [N, obs] array")
    scales, weights_q, weight_scales = [], [], []
    for x, w in zip(layer_inputs(policy, obs), policy.weights, strict=True):
        amax = float(np.percentile(np.abs(x), percentile) if percentile < 100 else np.abs(x).max())
        scales.append(float(np.float32(max(amax, 1e-8) / FP8_MAX)))
        s_w = (np.maximum(np.abs(w).max(axis=0), 1e-12) / FP8_MAX).astype(np.float32)
        weights_q.append(quantize_fp8(w, s_w[None, :]))
        weight_scales.append(s_w)
    return Fp8Policy(policy, tuple(scales), tuple(weights_q), tuple(weight_scales))


def fp8_forward(q: Fp8Policy, obs: np.ndarray) -> np.ndarray:
    """The float8 reference: obs [..., obs] → action [..., 4] (float32 dequantized matmuls)."""
    p = q.float_policy
    act = ACTIVATIONS_NP[p.activation]
    x = normalize_obs(p, obs)
    n = len(q.weights_q)
    for i in range(n):
        s = np.float32(q.input_scales[i])
        xd = quantize_fp8(x, s).astype(np.float32) * s
        wd = q.weights_q[i].astype(np.float32) * q.weight_scales[i]
        x = xd @ wd + p.biases[i]
        if i < n - 1:
            x = act(x)
    return np.clip(x, -1.0, 1.0).astype(np.float32)


# -- graph construction -----------------------------------------------------------------------
class _Graph:
    """Accumulates nodes and initializers; every node has one output named after the node."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def clip(self, x: str, bound: float, dtype: type, name: str, min_max: bool = False) -> str:
        """clip(x, ±bound) as one Clip node, or as Max(Min(x, bound), −bound) with `min_max`."""
        lo = self.const(f"{name}.min", np.array(-bound, dtype))
        hi = self.const(f"{name}.max", np.array(bound, dtype))
        if min_max:
            return self.op("Max", [self.op("Min", [x, hi], f"{name}.upper"), lo], name)
        return self.op("Clip", [x, lo, hi], name)

    def activation(self, kind: str, x: str, name: str) -> str:
        if kind == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x], f"{name}.sigmoid")], name)
        op_type = {"tanh": "Tanh", "relu": "Relu", "elu": "Elu"}[kind]
        return self.op(op_type, [x], name)


def build_model(
    policy: DensePolicy,
    precision: str,
    quantized: Int8Policy | Fp8Policy | None = None,
    metadata: dict[str, str] | None = None,
) -> onnx.ModelProto:
    """The checked (full_check) ONNX model of `policy` at `precision` (fp32, fp16, int8, fp8).

    int8 needs an `Int8Policy` and fp8 an `Fp8Policy` in `quantized`; `metadata` becomes
    `metadata_props`.
    """
    if policy.activation not in ("tanh", "relu", "elu", "silu"):
        raise ValueError(f"activation {policy.activation!r} has no ONNX translation")
    if precision not in ("fp32", "fp16", "int8", "fp8"):
        raise ValueError(f"unknown precision {precision!r}")
    need = {"int8": Int8Policy, "fp8": Fp8Policy}.get(precision)
    if need is not None and not isinstance(quantized, need):
        raise ValueError(f"precision {precision} needs a {need.__name__}")
    dtype = np.float16 if precision == "fp16" else np.float32
    g = _Graph()
    x = INPUT
    if precision == "fp16":
        x = g.op("Cast", [x], "obs.fp16", to=TensorProto.FLOAT16)
    x = g.op("Sub", [x, g.const("obs_mean", policy.obs_mean.astype(dtype))], "norm.centered")
    x = g.op("Div", [x, g.const("obs_std", policy.obs_std.astype(dtype))], "norm.scaled")
    # ONNX Runtime 1.32's ClipQuantFusion fails on a Clip feeding a float8 QuantizeLinear.
    x = g.clip(x, policy.obs_clip, dtype, "norm.clipped", min_max=precision == "fp8")
    n = len(policy.weights)
    for i in range(n):
        if precision in ("fp32", "fp16"):
            w = g.const(f"layer{i}.weight", policy.weights[i].astype(dtype))
            b = g.const(f"layer{i}.bias", policy.biases[i].astype(dtype))
        elif precision == "int8":
            x, w, b = _int8_layer(g, quantized, i, x)
        else:
            x, w, b = _fp8_layer(g, quantized, i, x)
        x = g.op("Add", [g.op("MatMul", [x, w], f"layer{i}.matmul"), b], f"layer{i}.add")
        if i < n - 1:
            x = g.activation(policy.activation, x, f"layer{i}.{policy.activation}")
    x = g.clip(x, 1.0, dtype, "head.clip" if precision == "fp16" else OUTPUT)
    if precision == "fp16":
        g.op("Cast", [x], OUTPUT, to=TensorProto.FLOAT)
    graph = helper.make_graph(
        g.nodes,
        f"hoverfly_policy_{precision}",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", policy.obs_size])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", policy.action_size])],
        g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="hoverfly",
        ir_version=IR_VERSION,
        doc_string=(
            f"Hoverfly {precision} policy: obs [batch, {policy.obs_size}] float32 → actions "
            f"[batch, {policy.action_size}] float32 in [-1, 1] (normalizer and deterministic head "
            "baked in). See metadata_props hoverfly.* for the observation layout and action map."
        ),
    )
    helper.set_model_props(model, metadata or {})
    onnx.checker.check_model(model, full_check=True)
    return model


def _int8_layer(g: _Graph, q: Int8Policy, i: int, x: str) -> tuple[str, str, str]:
    """Layer i's dequantized input, weight and bias under the int8 scheme of `deploy.quantize`."""
    s_in = np.float32(q.input_scales[i])
    if i == 0:
        x = g.op("Mul", [x, g.const("layer0.input_gain", q.input_gain)], "layer0.stretched")
    zero = g.const(f"layer{i}.input_zero_point", np.array(0, np.int8))
    scale = g.const(f"layer{i}.input_scale", np.array(s_in))
    x = g.clip(x, float(QMAX * s_in), np.float32, f"layer{i}.input_clip")
    x = g.op("QuantizeLinear", [x, scale, zero], f"layer{i}.input_q")
    x = g.op("DequantizeLinear", [x, scale, zero], f"layer{i}.input_dq")
    s_w = q.weight_scales[i]
    w = g.op(
        "DequantizeLinear",
        [
            g.const(f"layer{i}.weight_q", q.weights_q[i]),
            g.const(f"layer{i}.weight_scale", s_w),
            g.const(f"layer{i}.weight_zero_point", np.zeros(s_w.shape, np.int8)),
        ],
        f"layer{i}.weight",
        axis=1,
    )
    b = g.op(
        "DequantizeLinear",
        [
            g.const(f"layer{i}.bias_q", q.biases_q[i]),
            g.const(f"layer{i}.bias_scale", (s_in * s_w).astype(np.float32)),
        ],
        f"layer{i}.bias",
        axis=0,
    )
    return x, w, b


def _fp8_layer(g: _Graph, q: Fp8Policy, i: int, x: str) -> tuple[str, str, str]:
    """Layer i's dequantized input, weight and float bias under the FP8 scheme."""
    fp8 = ml_dtypes.float8_e4m3fn
    zero = g.const(f"layer{i}.input_zero_point", np.zeros((), fp8))
    scale = g.const(f"layer{i}.input_scale", np.array(np.float32(q.input_scales[i])))
    x = g.op("QuantizeLinear", [x, scale, zero], f"layer{i}.input_q", saturate=1)
    x = g.op("DequantizeLinear", [x, scale, zero], f"layer{i}.input_dq")
    s_w = q.weight_scales[i]
    w = g.op(
        "DequantizeLinear",
        [
            g.const(f"layer{i}.weight_q", q.weights_q[i]),
            g.const(f"layer{i}.weight_scale", s_w),
            g.const(f"layer{i}.weight_zero_point", np.zeros(s_w.shape, fp8)),
        ],
        f"layer{i}.weight",
        axis=1,
    )
    b = g.const(f"layer{i}.bias", q.float_policy.biases[i])
    return x, w, b
