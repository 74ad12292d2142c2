"""Learners (apg/, ppo/, sac/, residual/), presets, evaluation and the run folder."""

import os


def default_xla_flag(name: str, value: str) -> None:
    """Adds `--name=value` to XLA_FLAGS unless XLA_FLAGS already names `name`; takes effect only
    before JAX starts its backend."""
    flags = os.environ.get("XLA_FLAGS", "")
    if name not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --{name}={value}".strip()


# On a GPU, PPO's update is thousands of small kernels (32 minibatch steps and a 16-step rollout
# whose auto-reset is a while loop): XLA command buffers (CUDA graphs) over loops and conditionals
# too took the H200 preset from 14.7 to 10.1 ms per update (README, "PPO"). Set before JAX
# starts its backend; an XLA_FLAGS that already names the option wins. Ignored on the CPU.
default_xla_flag(
    "xla_gpu_enable_command_buffer", "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
)

from algos.presets import PRESETS, EvalConfig, TrainConfig, ValidationConfig, get_preset  # noqa: E402

__all__ = [
    "PRESETS",
    "EvalConfig",
    "TrainConfig",
    "ValidationConfig",
    "default_xla_flag",
    "get_preset",
]
