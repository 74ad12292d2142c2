"""Deployment of a trained run: the deterministic actor as plain arrays, int8 calibration, ONNX
export (fp32, fp16, int8 QDQ, fp8 E4M3) with parity and closed-loop checks, hardware-in-the-loop
over a serial link with the firmware running in QEMU, and a real Crazyflie through cflib.

Light modules are re-exported here; the others need optional extras and are imported from their
module: `deploy.onnx_export` (export_onnx, load_onnx_policy, read_metadata; extra `export`),
`deploy.hil` (run_hil; pyserial from `export`, plus arm-none-eabi-gcc and qemu-system-arm),
`deploy.serial_protocol` (the framed protocol, no I/O), `deploy.crazyflie` (fly; extra
`crazyflie`).
"""

from deploy.policy import DensePolicy, closed_loop_eval, forward, load_policy, record_rollouts
from deploy.quantize import Int8Policy, calibrate_int8, int8_forward

__all__ = [
    "DensePolicy",
    "Int8Policy",
    "calibrate_int8",
    "closed_loop_eval",
    "forward",
    "int8_forward",
    "load_policy",
    "record_rollouts",
]
