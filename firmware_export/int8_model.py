"""The exact integer arithmetic of the generated int8 C, in numpy (its test oracle).

It follows `deploy.quantize` (symmetric int8, per-output-channel weight scales, per-tensor input
scales, int32 accumulation, float activation) with two cheaper steps that make it differ from
`int8_forward` only rarely, by one int8 step of an input or hidden value:
- input: q = clip(round_half_even((obs − mean) · scale), ±127) with scale = f32(g/(std·s_in)) (g:
  the scheme's per-feature input gain), one multiply instead of two divisions and the gain;
- hidden activation: the next layer's int8 input q = round(act(acc·s_in·s_w) / s_out) is read
  from a table. v = (acc·2^shift · m) >> 32 is acc·s_in·s_w/s_out in fixed point with
  `frac_bits` fraction bits (m per output channel); the integer part selects a cell, and within
  a cell q takes at most two values: q = base[cell] + (frac(v) ≥ threshold[cell]). The table is
  built by evaluating the reference (float32 activation, round half to even) at every fixed-point
  value of each cell, so the only differences come from the 2^-frac_bits resolution of v.
The last layer is dequantized exactly like the reference: f32(acc) · f32(s_in·s_w), clip ±1.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from algos.run_folder import RunError
from deploy.policy import ACTIVATIONS_NP
from deploy.quantize import QMAX, Int8Policy

MAX_FRAC_BITS = 16


@dataclasses.dataclass(frozen=True)
class ActTable:
    shift: int
    """acc is multiplied by 2^shift before the high-word product (keeps m < 2^31)."""
    frac_bits: int
    multiplier: np.ndarray
    """int32 [out]: round(s_in·s_w / s_out · 2^(frac_bits + 32 − shift))."""
    base: np.ndarray
    """int8 [cells]: q at the bottom of each cell, cells −half .. half−1."""
    threshold: np.ndarray
    """uint16 [cells]: the fraction (in units of 2^-frac_bits) from which q = base + 1."""


@dataclasses.dataclass(frozen=True)
class Layer:
    weights: np.ndarray
    """int8 [in, out]."""
    bias: np.ndarray
    """int32 [out], at the accumulator scale."""
    table: ActTable | None
    """Hidden layers: the requantizing activation."""
    dequant: np.ndarray | None
    """Last layer: float32 [out], s_in·s_w."""


@dataclasses.dataclass(frozen=True)
class Int8Model:
    in_mean: np.ndarray
    """float32 [obs]."""
    in_scale: np.ndarray
    """float32 [obs]: g/(std·s_in0), g the per-feature input gain."""
    layers: tuple[Layer, ...]
    history: int
    """Actions in the observation's history (the float policy's action_history)."""


def build(q: Int8Policy) -> Int8Model:
    """The C's constants for `q` (RunError when a size or scale does not fit the int8 C)."""
    p = q.float_policy
    for w in q.weights_q:
        if w.shape[1] % 4:
            raise RunError(
                f"int8 C needs layer outputs in multiples of 4 (SMLAD blocks); got {w.shape}"
            )
    scale0 = np.float32(q.input_scales[0])
    gain = q.input_gain.astype(np.float64)
    in_scale = (gain / (p.obs_std.astype(np.float64) * float(scale0))).astype(np.float32)
    layers = []
    n = len(q.weights_q)
    for i in range(n):
        acc_scale = (np.float32(q.input_scales[i]) * q.weight_scales[i]).astype(np.float32)
        w, b = q.weights_q[i], q.biases_q[i].astype(np.int32)
        if i == n - 1:
            layers.append(Layer(w, b, None, acc_scale))
            continue
        bound = int((np.abs(w.astype(np.int64)).sum(0) * QMAX + np.abs(b)).max())
        table = _table(acc_scale, bound, np.float32(q.input_scales[i + 1]), p.activation)
        layers.append(Layer(w, b, table, None))
    return Int8Model(p.obs_mean.astype(np.float32), in_scale, tuple(layers), p.action_history)


def forward(m: Int8Model, obs: np.ndarray) -> np.ndarray:
    """obs [..., obs] float32 → action [..., 4], exactly as the generated C computes it."""
    v = (np.asarray(obs, np.float32) - m.in_mean) * m.in_scale
    x = np.round(np.clip(v, -QMAX, QMAX)).astype(np.int64)
    for layer in m.layers:
        acc = x @ layer.weights.astype(np.int64) + layer.bias
        if layer.table is None:
            y = acc.astype(np.float32) * layer.dequant
            return np.clip(y, -1.0, 1.0).astype(np.float32)
        x = apply_table(layer.table, acc)
    raise AssertionError("no layers")


def apply_table(t: ActTable, acc: np.ndarray) -> np.ndarray:
    """int8 values (as int64) of the hidden activation for int32 accumulators acc [..., out]."""
    v = ((acc.astype(np.int64) << t.shift) * t.multiplier.astype(np.int64)) >> 32
    half = len(t.base) // 2
    cell = np.clip(v >> t.frac_bits, -half, half - 1) + half
    frac = v & ((1 << t.frac_bits) - 1)
    return t.base[cell].astype(np.int64) + (frac >= t.threshold[cell])


def _reference_q(y: np.ndarray, s_out: np.float32, activation: str) -> np.ndarray:
    """deploy.quantize's next-layer input: clip(round(act(y) / s_out), ±127), float32 ops."""
    a = ACTIVATIONS_NP[activation](np.asarray(y, np.float32)).astype(np.float32)
    return np.clip(np.round(a / s_out), -QMAX, QMAX).astype(np.int64)


def _table(acc_scale: np.ndarray, bound: int, s_out: np.float32, activation: str) -> ActTable:
    shift = max(0, 31 - int(bound).bit_length())  # |acc| · 2^shift < 2^31
    ratio = acc_scale.astype(np.float64) / float(s_out)
    # The finest resolution (≤ MAX_FRAC_BITS) whose multipliers fit in int32.
    for frac_bits in range(MAX_FRAC_BITS, 3, -1):
        multiplier = np.round(ratio * 2.0 ** (frac_bits + 32 - shift))
        if multiplier.max() < 2**31:
            break
    if multiplier.max() >= 2**31 or multiplier.min() < 2**12:
        raise RunError(f"int8 scales out of the C's fixed-point range (s_in·s_w/s_out {ratio})")
    one = 1 << frac_bits

    def q_at(v: np.ndarray) -> np.ndarray:  # v: fixed-point values of y / s_out
        return _reference_q(v / one * float(s_out), s_out, activation)

    # Cells (units of s_out) beyond which q no longer changes, on both sides.
    edges = np.arange(0, 1 << 14, dtype=np.float64) * one
    top, bottom = q_at(edges), q_at(-edges)
    last = max(int(np.argmax(top == top[-1])), int(np.argmax(bottom == bottom[-1])))
    half = 1 << int(last + 1).bit_length()
    cells = np.arange(-half, half, dtype=np.float64) * one
    lo, hi = q_at(cells), q_at(cells + one - 1)
    if np.any((hi - lo) > 1) or np.any(hi < lo):
        raise RunError(f"activation {activation!r} steps more than once per int8 cell")
    # First fraction with q = hi (bisection; q is monotone in v).
    left, right = np.zeros_like(cells), np.full_like(cells, one - 1)
    for _ in range(frac_bits):
        mid = np.floor((left + right) / 2)
        up = q_at(cells + mid) == hi
        right, left = np.where(up, mid, right), np.where(up, left, mid + 1)
    stepped = hi > lo
    return ActTable(
        shift=shift,
        frac_bits=frac_bits,
        multiplier=multiplier.astype(np.int32),
        base=np.where(stepped, lo, lo - 1).astype(np.int8),
        threshold=np.where(stepped, right, 0).astype(np.uint16),
    )
