"""`VLAResidualConfig`: a PPO residual on a frozen VLA (`vla.residual`), torch-free so the CLI
parses it without importing torch."""

from __future__ import annotations

import dataclasses
from typing import Literal

from algos.ppo import PPOConfig
from algos.presets import ARM_PRESETS, ARM_SAC_PRESETS
from algos.residual import ObsAugmentation, ResidualScale
from algos.sac import SACConfig
from sim import manipulator

POSE_FIELDS = ("cube_pos", "cube_minus_tcp", "goal_minus_cube")
"""Object-pose fields of the arm observation that the augmentation corrupts (the residual's)."""

_PPO = dataclasses.replace(
    ARM_PRESETS["cpu"].ppo,
    num_envs=64,
    unroll_length=16,
    total_timesteps=64 * 16 * 100,
    network=dataclasses.replace(ARM_PRESETS["cpu"].ppo.network, init_log_std=-1.5),
)
_SAC = dataclasses.replace(
    ARM_SAC_PRESETS["cpu"].sac, num_envs=64, unroll_length=16, total_timesteps=64 * 16 * 100
)


@dataclasses.dataclass(frozen=True)
class VLAResidualConfig:
    """A PPO residual on a frozen VLA in arm pick-place (the env the VLA's data was collected
    in), written to the run folder `out` (`algos.run_folder`: resumable, evaluated at the end)."""

    checkpoint: str
    """Frozen VLA: a checkpoint folder (its train_state.pt has the env info) or an SFT / RL run
    folder (its newest checkpoint)."""
    out: str
    """Run folder (created, or resumed when it holds this config)."""
    seed: int = 0
    """Seed of the training run."""
    scale: ResidualScale = ResidualScale(start=0.5, end=0.5)
    """Bound on the correction per action component."""
    augmentation: ObsAugmentation = ObsAugmentation(
        fields=POSE_FIELDS, noise_std=0.005, dropout_prob=0.1, targets=("residual",)
    )
    """Object-pose noise and dropout on the residual's observation (the VLA sees images)."""
    view: Literal["poses", "vla"] = "poses"
    """What the residual's actor sees: "poses", the arm observation with its object poses (under
    `augmentation`; the object-centric recipe); "vla", what the VLA sees: its proprio state and
    the pooled prefix features of the episode's first plan and of its latest (no object poses,
    `augmentation` unused). Either way the critic reads the privileged state."""
    perturbation: manipulator.PerturbationConfig = manipulator.PerturbationConfig(episode_prob=0.0)
    """Arm perturbations (pose-detection errors, shoves) in training and evaluation; off at 0."""
    algo: Literal["ppo", "sac"] = "ppo"
    """Learner of the residual: PPO, or SAC (off-policy: every env step, which the VLA's
    rendering makes expensive, is replayed in many updates)."""
    ppo: PPOConfig = _PPO
    """PPO settings (the arm preset's, 64 envs, a small initial σ: the untrained residual ≈ 0)."""
    sac: SACConfig = _SAC
    """SAC settings (the arm preset's, 64 envs; its initial σ is small too)."""
    episode_steps: int | None = None
    """Episode length, control steps (None: the checkpoint's collect `max_steps`)."""
    eval_episodes: int = 64
    """Evaluation episodes (the same for the base alone and base + residual)."""
    eval_seed: int = 12345
    """Key of the evaluation episodes."""
    checkpoint_every: int = 10
    """PPO updates between checkpoints."""
