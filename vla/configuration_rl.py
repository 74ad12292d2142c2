"""`RLConfig`: on-policy RL post-training settings of `vla.rl` (torch-free, so the CLI parses it
without importing torch)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class RLConfig:
    """RL post-training of an SFT'd `HoverflyVLA` on action chunks in the MJX arm env it was
    trained for (the env settings come with the checkpoint)."""

    init: str = ""
    """Where training starts: an SFT run folder (its newest checkpoint) or a checkpoint folder."""
    task: str = "arm-pick-place"
    """Task to post-train in: the one the checkpoint's demonstrations were collected in."""
    out: str = "runs/vla_rl"
    """Run folder: metrics, checkpoints; an existing run there is resumed."""
    algo: Literal["ppo", "grpo", "rft"] = "ppo"
    """"ppo": clipped surrogate with GAE over chunks and the value head on the shared backbone;
    "grpo": group-relative outcome advantages, groups of `group_size` episodes started from
    identical simulator states, no critic; "rft": rejection-sampling fine-tuning (ReST-EM,
    RAFT): the successful episodes of every iteration are kept as demonstrations, one frame per
    executed chunk with the actions executed from it, and trained on with the flow-matching loss
    (`epochs` passes' worth of the new frames per iteration, minibatches from all of them); in
    groups of `group_size` from identical states, with `dynamic_sampling` only the successes of
    states the policy does not always solve (the frontier) are kept."""
    ratio: Literal["flow_noise", "fpo"] = "flow_noise"
    """How rollouts sample chunks and the update scores them (rft: only how they sample).
    "flow_noise": every Euler step is a Gaussian transition with the learned std (πRL's
    Flow-Noise), one clipped ratio per denoising step (DPPO's two-layer MDP); "fpo": the
    evaluation sampler (Euler ODE from random noise), one clipped ratio exp(ℓ_old − ℓ_new) per
    (noise, time) draw of the flow-matching error ℓ of the chunk's executed actions (FPO,
    McAllister et al. 2025)."""
    fpo_draws: int = 8
    """FPO: (noise, time) draws per chunk."""
    iterations: int = 40
    """Rollout + update rounds."""
    num_envs: int = 32
    """Episodes per iteration (run batched; a multiple of `group_size` for GRPO and RFT)."""
    group_size: int = 8
    """GRPO, RFT: episodes per group (identical reset state, independent flow noise; RFT: 1
    for every episode its own state)."""
    max_steps: int | None = None
    """Episode length, control steps (default: the dataset's `max_steps`)."""
    dense_reward_coef: float = 0.0
    """Chunk reward = 1 at the chunk that ends a successful episode + this × the env's shaped
    reward summed over the chunk's executed steps."""
    gamma: float = 0.99
    """PPO: discount per chunk."""
    gae_lambda: float = 0.95
    """PPO: GAE λ."""
    epochs: int = 2
    """Passes over each iteration's chunks (rft: over its new successful frames)."""
    minibatch_size: int = 64
    """Chunks per gradient step."""
    lr: float = 3e-5
    """AdamW learning rate of the policy (backbone, expert, noise std)."""
    value_lr: float = 3e-4
    """AdamW learning rate of the value head."""
    clip_low: float = 0.2
    """Ratio clip below: 1 − clip_low."""
    clip_high: float = 0.28
    """Ratio clip above: 1 + clip_high ("clip-higher", DAPO / SimpleVLA-RL)."""
    vf_coef: float = 0.5
    """PPO: weight of the value loss."""
    value_warmup_iterations: int = 1
    """PPO: the first iterations train the value head only (critic warm-up)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    target_kl: float | None = 0.05
    """Stop an iteration's remaining minibatches once the approximate KL(old ‖ new) exceeds it."""
    dynamic_sampling: bool = True
    """GRPO: drop groups whose episodes all succeeded or all failed (zero advantage); RFT: drop
    the successes of groups whose episodes all succeeded."""
    sft_coef: float = 0.0
    """RL-Co: weight λ of the flow-matching loss on `sft_data` added to every gradient step."""
    sft_data: str = ""
    """RL-Co: held demonstration dataset (LeRobotDataset) for the SFT anchor."""
    sft_batch_size: int = 32
    """RL-Co: frames per anchor batch."""
    ema_decay: float = 0.0
    """Exponential moving average of the weights, updated after every gradient step
    (p̄ ← d · p̄ + (1 − d) · p): rollouts and updates use the trained weights, evaluations and
    the checkpoints' model the average (the trained weights go to train_state.pt). 0: off."""
    eval_every: int = 5
    """Deterministic closed-loop evaluation every this many iterations (and at the end); 0: at
    the end only."""
    eval_episodes: int = 32
    """Episodes per evaluation (same seeds every time, apart from training's)."""
    checkpoint_every: int = 1
    """Save a checkpoint every this many iterations (and at the end)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept."""
    seed: int = 0
    """Seeds the rollouts (reset states, flow noise) and minibatch order per iteration."""
    device: str = "cpu"
    """torch device."""

    def validate(self) -> None:
        """ValueError naming the first bad field."""
        if not self.init:
            raise ValueError("RLConfig.init: an SFT run folder or checkpoint is required")
        if not self.out:
            raise ValueError("RLConfig.out: a run folder is required")
        if self.algo not in ("ppo", "grpo", "rft"):
            raise ValueError(f"RLConfig.algo: {self.algo!r} is not 'ppo', 'grpo' or 'rft'")
        if self.ratio not in ("flow_noise", "fpo"):
            raise ValueError(f"RLConfig.ratio: {self.ratio!r} is not 'flow_noise' or 'fpo'")
        for name in (
            "iterations",
            "fpo_draws",
            "num_envs",
            "group_size",
            "epochs",
            "minibatch_size",
            "sft_batch_size",
            "eval_episodes",
            "checkpoint_every",
            "keep_checkpoints",
        ):
            _int_at_least(name, getattr(self, name), 1)
        for name in ("value_warmup_iterations", "eval_every", "seed"):
            _int_at_least(name, getattr(self, name), 0)
        if self.max_steps is not None:
            _int_at_least("max_steps", self.max_steps, 1)
        if self.algo == "grpo" and (self.group_size < 2 or self.num_envs % self.group_size):
            raise ValueError(
                f"RLConfig.group_size: GRPO needs groups of ≥ 2 that divide num_envs "
                f"({self.num_envs}), got {self.group_size}"
            )
        if self.algo == "rft" and self.num_envs % self.group_size:
            raise ValueError(
                f"RLConfig.group_size: {self.group_size} does not divide num_envs ({self.num_envs})"
            )
        for name, ok in (
            ("lr", self.lr > 0),
            ("value_lr", self.value_lr > 0),
            ("clip_low", 0 < self.clip_low < 1),
            ("clip_high", self.clip_high > 0),
            ("gamma", 0 < self.gamma <= 1),
            ("gae_lambda", 0 <= self.gae_lambda <= 1),
            ("vf_coef", self.vf_coef >= 0),
            ("max_grad_norm", self.max_grad_norm > 0),
            ("dense_reward_coef", self.dense_reward_coef >= 0),
            ("sft_coef", self.sft_coef >= 0),
            ("ema_decay", 0 <= self.ema_decay < 1),
        ):
            if not ok or not math.isfinite(getattr(self, name)):
                raise ValueError(f"RLConfig.{name}: {getattr(self, name)!r} out of range")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"RLConfig.target_kl: must be > 0 or None, got {self.target_kl!r}")
        if (self.sft_coef > 0) != bool(self.sft_data):
            raise ValueError("RLConfig.sft_data: needed exactly when sft_coef > 0 (RL-Co)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _int_at_least(name: str, v: Any, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"RLConfig.{name}: must be an int ≥ {lo}, got {v!r}")
