"""Learners (ppo/, sac/, residual/), presets, evaluation and the run folder."""

import os

# On a GPU, PPO's update is thousands of small kernels (32 minibatch steps and a 16-step rollout
# whose auto-reset is a while loop): XLA command buffers (CUDA graphs) over loops and conditionals
# too took the H200 preset from 14.7 to 10.1 ms per update (README, "Training"). Set before JAX
# starts its backend; an XLA_FLAGS that already names the option wins. Ignored on the CPU.
_COMMAND_BUFFER = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
if "xla_gpu_enable_command_buffer" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_enable_command_buffer={_COMMAND_BUFFER}"
    ).strip()

from algos.presets import PRESETS, EvalConfig, TrainConfig, get_preset  # noqa: E402

__all__ = ["PRESETS", "EvalConfig", "TrainConfig", "get_preset"]
