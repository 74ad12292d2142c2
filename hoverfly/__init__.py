"""Hoverfly: GPU-vectorized JAX simulators and learners for aerial control, with export.

This package is the facade: the `hoverfly` command (`hoverfly.cli`) and re-exports of the public
API; the logic lives in `sim/`, `policies/` and `algos/`.
"""

from algos import EvalConfig, TrainConfig, get_preset
from algos.run_folder import (
    Checkpoint,
    Run,
    RunError,
    latest_checkpoint,
    load_checkpoint,
    load_run,
    read_config,
    save_checkpoint,
)
from algos.runner import TrainResult, evaluate_run, train

__all__ = [
    "Checkpoint",
    "EvalConfig",
    "Run",
    "RunError",
    "TrainConfig",
    "TrainResult",
    "evaluate_run",
    "get_preset",
    "latest_checkpoint",
    "load_checkpoint",
    "load_run",
    "read_config",
    "save_checkpoint",
    "train",
]
