"""Learners (ppo/, sac/; residual/ arrives later), presets, evaluation and the run folder."""

from algos.presets import PRESETS, EvalConfig, TrainConfig, get_preset

__all__ = ["PRESETS", "EvalConfig", "TrainConfig", "get_preset"]
