"""Analytic policy gradients in JAX: backpropagation through the differentiable simulator
(truncated BPTT windows over batched envs, as brax's APG; SHAC without the critic)."""

from algos.apg.config import APGConfig
from algos.apg.train import make_network, make_train

__all__ = ["APGConfig", "make_network", "make_train"]
