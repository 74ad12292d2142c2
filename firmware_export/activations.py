"""Hidden-layer activations of the generated float32 C, and their numpy twins.

tanh costs 100+ cycles as newlib's `tanhf` on a Cortex-M4; the C uses instead
    tanh(x) ≈ x·P(x²) / Q(x²),  x clamped to ±TANH_CLAMP,
P and Q of degree 4 in x² (a weighted least-squares minimax fit on [0, 9]; coefficients as
float32): 10 multiply-adds, one division (~35 cycles). Its max |error| against the exact tanh,
evaluated in float32, is below TANH_MAX_ERROR (3.4e-7, i.e. a few ulp near ±1; the fit itself is
2e-8, the rest is float32 rounding) — a test checks it on a 4M-point grid over [−12, 12]. Beyond
±9, tanh differs from ±1 by less than 3e-8.
"""

from __future__ import annotations

import numpy as np

SUPPORTED = ("tanh", "relu")
TANH_CLAMP = 9.0
TANH_MAX_ERROR = 4e-7
TANH_P = (
    0.9999998807907104,
    0.13373318314552307,
    0.0034867222420871258,
    2.047403722826857e-05,
    1.3187083425236779e-08,
)
"""Numerator coefficients of x·P(x²), lowest power first."""
TANH_Q = (
    1.0,
    0.4670661389827728,
    0.025842519477009773,
    0.0003271610476076603,
    7.703875439801777e-07,
)
"""Denominator coefficients of Q(x²), lowest power first."""


def tanh_f32(x: np.ndarray) -> np.ndarray:
    """The C approximation, operation for operation in float32 (no fused multiply-add)."""
    x = np.clip(np.asarray(x, np.float32), -TANH_CLAMP, TANH_CLAMP)
    z = x * x
    p = np.float32(TANH_P[-1])
    for c in TANH_P[-2::-1]:
        p = p * z + np.float32(c)
    q = np.float32(TANH_Q[-1])
    for c in TANH_Q[-2::-1]:
        q = q * z + np.float32(c)
    return (x * p / q).astype(np.float32)


def c_source(activation: str) -> str:
    """C defining `static float ACTIVATION(float x)` for a supported activation."""
    if activation == "relu":
        return "static float ACTIVATION(float x) { return x > 0.0f ? x : 0.0f; }\n"

    def horner(coefs: tuple[float, ...]) -> str:
        text = c_float(coefs[-1])
        for c in coefs[-2::-1]:
            text = f"({text} * z + {c_float(c)})"
        return text

    clamp = c_float(TANH_CLAMP)
    return f"""\
#if defined(__GNUC__)
#define UNLIKELY(c) __builtin_expect(!!(c), 0) /* the common case falls through */
#else
#define UNLIKELY(c) (c)
#endif

/* tanh(x) ≈ x·P(x²)/Q(x²), |error| < {TANH_MAX_ERROR:g} (firmware_export/activations.py). */
static float ACTIVATION(float x) {{
  if (UNLIKELY(!(fabsf(x) <= {clamp}))) x = x > 0.0f ? {clamp} : -{clamp};
  const float z = x * x;
  const float p = {horner(TANH_P)};
  const float q = {horner(TANH_Q)};
  return x * p / q;
}}
"""


def c_float(x: float) -> str:
    """A C float literal that round-trips float32(x) exactly."""
    text = f"{float(np.float32(x)):.9g}"
    if not any(ch in text for ch in ".en"):  # "nan"/"inf" are not C literals anyway
        text += ".0"
    return text + "f"
