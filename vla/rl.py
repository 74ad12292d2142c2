"""On-policy RL post-training of the compact VLA on action chunks in the MJX arm simulator.

The policy acts once per chunk: it sees the rendered cameras, the instruction and the proprio
state, samples a chunk, and the env executes its first K actions. Two ways to sample and score a
chunk (`RLConfig.ratio`):

- "flow_noise": each of the N Euler steps is a Gaussian transition with the learned std, so the
  log-probability of every step is exact and recomputable (πRL, Chen et al. 2025, "Flow-Noise").
  The update clips one ratio per denoising step (DPPO, Ren et al. 2024: the denoising chain as
  an inner MDP), not the product over the chain: a shift of the mean that moves the chunk's
  log-probability by ε over its N · H · A Gaussian terms would otherwise saturate the clip.
- "fpo": the chunk is the evaluation sampler's (Euler ODE from random noise: training explores
  with the policy that is evaluated); its score is minus the flow-matching error ℓ of M random
  (noise, time) draws over the K executed actions (the rest never reach the env), and the update
  clips one ratio exp(ℓ_old − ℓ_new) per draw (Flow Policy Optimization, McAllister et al. 2025:
  ℓ bounds the log-likelihood up to a constant).

- PPO (Schulman et al. 2017) over chunks: GAE on the chunk-level rewards with the value head on
  the shared prefix backbone (RL4VLA: a shared actor-critic), clipped ratio with "clip-higher"
  bounds [1 − clip_low, 1 + clip_high] (DAPO; SimpleVLA-RL), critic warm-up iterations.
- GRPO (Shao et al. 2024): groups of G episodes reset from identical simulator states; the
  advantage of every chunk of episode i is (R_i − mean_group R) / std_group R with the binary
  outcome R; groups whose outcomes are all equal are dropped (dynamic sampling, SimpleVLA-RL).
- RFT (rejection-sampling fine-tuning, `vla.rft`): the successful episodes become
  demonstrations, trained on with the flow-matching loss.
- RL-Co (sim-real co-training): λ · the flow-matching loss on a held demonstration set is added
  to every gradient step so the policy does not forget its demonstrations.
- EMA (`ema_decay`): an exponential moving average of the weights, updated after every gradient
  step, is what evaluations see and checkpoints hold; rollouts and updates use the trained
  weights (Polyak averaging; as diffusion policies are evaluated).
- Monitors per iteration: approximate KL(old ‖ new) (k3 estimator, Schulman 2020) — also the early
  stop of an iteration's updates (`target_kl`) —, KL(policy ‖ the initial SFT policy) on the
  rollout's chunks, both per ratio term (denoising step or FPO draw), the per-dimension entropy of
  the flow noise (flow_noise), the clip fraction.

Rewards: 1 at the chunk that ends a successful episode (`vla.collect` success: the cube at the goal
and still there `hold_steps` later) + `dense_reward_coef` × the env's shaped reward of the
chunk's steps. Episodes last until that end (`vla.collect.episode_length`); later chunks are
masked.

Run folder::

    <out>/rl_config.json               RLConfig (init: the resolved checkpoint), the model config
    <out>/metrics.csv                  one row per iteration (see `_METRICS`)
    <out>/eval.csv                     iteration, success_rate, ... (iteration 0: the start)
    <out>/learning_curve.png           train and eval success per iteration
    <out>/checkpoints/iter_<NNNNNN>/   vla.checkpoint folders (+ optimizer, iteration, env)
    <out>/replay/iter_<NNNNNN>.npz     rft: that iteration's successful frames (`vla.rft`)

A rerun with the same `out` resumes after its newest checkpoint; every iteration's randomness
derives from (seed, iteration), so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.run_folder import atomic_write
from vla import rft
from vla.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_train_state,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from vla.configuration_rl import RLConfig
from vla.frames import gather_batch, load_frames
from vla.modeling_hoverfly_vla import HoverflyVLA
from vla.processor_hoverfly_vla import HoverflyVLAProcessor
from vla.sft import (
    _EVAL_COLUMNS,
    _all_finished,
    _append_csv,
    _compiled_env,
    _evaluate,
    _progress,
    _refuse_changed_config,
    _render,
    _truncate_csv,
    make_ema,
    restore_weights,
    trained_weights,
    update_ema,
)

__all__ = [
    "compute_gae",
    "compute_group_advantages",
    "compute_policy_loss",
    "plot_learning_curve",
    "summarize",
    "train_rl",
]

_RESUMABLE = (
    "iterations",
    "eval_every",
    "eval_episodes",
    "checkpoint_every",
    "keep_checkpoints",
    "device",
)
"""RLConfig fields a resumed run may change."""
_METRICS = (
    "iteration",
    "train_success",
    "mean_return",
    "chunks",
    "env_steps",
    "groups_kept",
    "policy_loss",
    "value_loss",
    "sft_loss",
    "approx_kl",
    "kl_ref",
    "entropy",
    "clip_frac",
    "updates",
    "replay_frames",
    "rollout_s",
    "render_s",
    "model_s",
    "sim_s",
    "update_s",
)
_EVAL_SEED = 1_000_003
"""Offset of the evaluation seed from `RLConfig.seed` (evaluation episodes never train)."""


# -- pure maths ------------------------------------------------------------------------------------
def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over chunks: rewards, values, mask [B, T] (mask 1 while the episode runs; each episode
    ends at its last valid chunk, with no bootstrap after it). Returns advantages and returns
    [B, T] (0 where masked).

        δ_t = r_t + γ V_{t+1} m_{t+1} − V_t,   A_t = δ_t + γ λ m_{t+1} A_{t+1}
    """
    b, t = rewards.shape
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros(b, dtype=rewards.dtype)
    next_value = torch.zeros(b, dtype=rewards.dtype)
    next_mask = torch.zeros(b, dtype=rewards.dtype)
    for i in reversed(range(t)):
        delta = rewards[:, i] + gamma * next_value * next_mask - values[:, i]
        next_adv = (delta + gamma * lam * next_mask * next_adv) * mask[:, i]
        adv[:, i] = next_adv
        next_value, next_mask = values[:, i], mask[:, i]
    return adv, (adv + values) * mask


def compute_group_advantages(
    outcomes: torch.Tensor, group_size: int, drop_uniform: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO advantages of episodes whose outcomes [B] come in consecutive groups of `group_size`:
    A_i = (R_i − mean_g) / (std_g + eps) (population std). Returns advantages [B] and keep [B]
    (bool: False for the episodes of a group with std 0 when `drop_uniform`)."""
    r = outcomes.reshape(-1, group_size).to(torch.float64)
    mean = r.mean(1, keepdim=True)
    std = r.std(1, unbiased=False, keepdim=True)
    adv = ((r - mean) / (std + eps)).reshape(-1)
    keep = (std > 0).expand_as(r).reshape(-1) if drop_uniform else torch.ones_like(adv, dtype=bool)
    return adv.to(outcomes.dtype), keep


def compute_policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate over chunks: logp, logp_old [M] or [M, S] (S ratio terms per chunk, each
    clipped on its own), adv [M]:
    L = −mean min(ρ A, clip(ρ, 1 − clip_low, 1 + clip_high) A), ρ = exp(logp − logp_old).
    Also returns approx_kl = mean((ρ − 1) − log ρ) (k3, KL(old ‖ new)) and clip_frac."""
    adv = adv.reshape(adv.shape + (1,) * (logp.dim() - adv.dim()))
    log_ratio = logp - logp_old
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(ratio * adv, clipped * adv).mean()
    with torch.no_grad():
        stats = {
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_frac": ((ratio - clipped).abs() > 1e-8).float().mean(),
        }
    return loss, stats


def _kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """KL(π ‖ π_ref) estimated on samples of π: mean(r − 1 − log r), r = π_ref / π."""
    log_r = (logp_ref - logp).clamp(-20.0, 20.0)
    return (log_r.exp() - 1.0 - log_r).mean()


def _sample_chunk(
    model: HoverflyVLA,
    batch: dict[str, torch.Tensor],
    cache,
    generator: torch.Generator,
    ratio: str,
    draws: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """A chunk [B, H, A] (normalized), what `_score` needs to score it again {name: [B, ...]}, and
    its score [B, S] (`RLConfig.ratio`)."""
    if ratio == "flow_noise":
        chunk, trajectory, logp = model.sample_with_logprob(batch, generator, cache=cache)
        return chunk, {"trajectory": trajectory}, logp
    chunk = model.sample_actions(batch, generator=generator, cache=cache)
    b, dev = chunk.shape[0], chunk.device
    noise = torch.randn((b, draws, *chunk.shape[1:]), generator=generator, device=dev)
    record = {
        "actions": chunk,
        "noise": noise,
        "time": model.sample_time((b, draws), generator, dev, chunk.dtype),
    }
    with torch.no_grad():
        return chunk, record, _score(model, batch, record, cache)


def _score(
    model: HoverflyVLA, batch: dict[str, torch.Tensor], record: dict[str, torch.Tensor], cache=None
) -> torch.Tensor:
    """Score [B, S] of recorded chunks (differentiable): the log-probability of each denoising
    step (flow_noise) or minus the flow-matching error of each draw (fpo)."""
    cache = model.embed_prefix(batch) if cache is None else cache
    if "trajectory" in record:
        return model.log_prob(batch, record["trajectory"], cache)
    noise, time, k = record["noise"], record["time"], model.config.n_action_steps
    return -model.flow_matching_errors(cache, record["actions"], noise, time, steps=k)


def _noise_entropy(model: HoverflyVLA) -> float:
    """Entropy per dimension of one flow-noise transition: mean_a ½ log(2πe σ_a²)."""
    std = model.noise_std().detach()
    return float((0.5 * math.log(2 * math.pi * math.e) + std.log()).mean())


# -- rollouts --------------------------------------------------------------------------------------
@dataclass
class _Rollout:
    """One iteration's episodes, chunk-major per env: images uint8 [B, T, h, W · cams, 3] (the
    cameras side by side), proprio [B, T, Ds] (raw), texts [B], sample {name: [B, T, ...]} (what
    `_score` needs), logp [B, T, S] (the chunks' scores), value / reward / mask [B, T],
    actions [B, T_steps, A] (the executed actions, absolute, clipped), lengths [B] (steps of each
    episode), success [B], env_steps (executed in valid chunks),
    seconds {"render", "model", "sim"} (wall time of each part; `sim` includes the transfers)."""

    images: np.ndarray
    proprio: np.ndarray
    texts: list[str]
    sample: dict[str, torch.Tensor]
    logp: torch.Tensor
    value: torch.Tensor
    reward: torch.Tensor
    mask: torch.Tensor
    actions: np.ndarray
    lengths: np.ndarray
    success: np.ndarray
    env_steps: int
    seconds: dict[str, float]


def _rollout(
    model: HoverflyVLA,
    processor: HoverflyVLAProcessor,
    env_info: dict[str, Any],
    n_envs: int,
    group: int,
    seed: int,
    max_steps: int | None,
    dense_coef: float,
    compiler_options: tuple = (),
    ratio: str = "flow_noise",
    draws: int = 8,
) -> _Rollout:
    """`n_envs` episodes with the sampler of `ratio` (`draws`: FPO's draws per chunk), in groups
    of `group` envs reset from the same key (group 1: all different). Randomness (reset states,
    noise) from `seed`."""
    import jax
    import jax.numpy as jnp

    from sim.manipulator import CameraRenderer, setup_gl
    from vla.collect import (
        COLOURS,
        collect_config_from_info,
        episode_length,
        goal_region,
        instruction,
        state_index,
    )

    setup_gl()
    ccfg = collect_config_from_info(env_info)
    c = model.config
    k, t_max = c.n_action_steps, ccfg.max_steps if max_steps is None else max_steps
    env, reset, execute = _compiled_env(ccfg, k, compiler_options)
    arm = env.unwrapped
    state_idx = jnp.asarray(state_index(env_info["state_fields"], env.action_size))
    key_env, key_noise = jax.random.split(jax.random.key(seed))
    state = reset(jax.random.split(key_env, n_envs // group))
    if group > 1:
        state = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), state)
    dead = jnp.zeros(n_envs)
    dev = model.patch_pos.device
    noise_gen = torch.Generator(dev).manual_seed(
        int(jax.random.randint(key_noise, (), 0, 2**31 - 1))
    )
    colours = [ccfg.colours[(i // group) % len(ccfg.colours)] for i in range(n_envs)]
    goals = np.asarray(jax.device_get(state.data.goal))
    texts = [
        instruction(col, goal_region(g[:2], arm.config.init.cube_center))
        for col, g in zip(colours, goals, strict=True)
    ]
    h, w = ccfg.image_size
    steps: dict[str, list] = {"success": [], "done": [], "reward": []}
    chunks: dict[str, list] = {k_: [] for k_ in ("images", "proprio", "sample", "logp", "value")}
    executed = []
    seconds = {"render": 0.0, "model": 0.0, "sim": 0.0}
    clock = time.perf_counter()

    def lap(part: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[part] += now - clock
        clock = now

    with CameraRenderer(env, c.cameras, h, w, ccfg.wrist_camera) as renderer:
        if not ccfg.shadows:
            renderer.model.light_castshadow[:] = 0
        t = 0
        lap("sim")  # reset, compilation
        while t < t_max:
            images = _render(renderer, state, colours, arm.index.cube_geom, COLOURS)
            proprio = torch.from_dlpack(jnp.take(state.obs["state"], state_idx, axis=1))
            proprio = proprio.to("cpu", torch.float32)  # the processor runs on the host
            lap("render")
            batch = _model_batch(processor, images, proprio.numpy(), texts, w, dev)
            with torch.no_grad():
                cache = model.embed_prefix(batch)
                value = model.value(batch, cache)
                chunk, record, logp = _sample_chunk(model, batch, cache, noise_gen, ratio, draws)
            actions = processor.actions_from_model(chunk.cpu(), proprio)[:, :k].clamp(-1.0, 1.0)
            executed.append(actions.numpy())
            lap("model")
            actions = jnp.asarray(actions.transpose(0, 1).numpy())  # [K, B, A]
            state, dead, (s, d, r) = execute(state, dead, actions)
            for key_, v in zip(("success", "done", "reward"), (s, d, r), strict=True):
                steps[key_].append(np.asarray(v))
            lap("sim")
            for key_, v in zip(
                chunks,
                (
                    images,
                    proprio.numpy(),
                    {n: v.cpu() for n, v in record.items()},
                    logp.cpu(),
                    value.cpu(),
                ),
                strict=True,
            ):
                chunks[key_].append(v)
            t += k
            success = np.concatenate(steps["success"])
            if _all_finished(success, np.concatenate(steps["done"]), ccfg.hold_steps):
                break
    success = np.concatenate(steps["success"])[:t_max].T  # [B, T_steps]
    done = np.concatenate(steps["done"])[:t_max].T
    step_reward = np.concatenate(steps["reward"])[:t_max].T
    n_chunks = len(chunks["logp"])
    pairs = zip(success, done, strict=True)
    lengths = np.array([episode_length(s, d, ccfg.hold_steps) for s, d in pairs])
    ok = success[np.arange(n_envs), lengths - 1] > 0
    live = np.arange(success.shape[1])[None] < lengths[:, None]  # [B, T_steps]
    dense = dense_coef * step_reward * live
    reward = np.stack([dense[:, i * k : (i + 1) * k].sum(1) for i in range(n_chunks)], 1)
    reward[np.arange(n_envs), (lengths - 1) // k] += ok
    mask = np.arange(n_chunks)[None] <= ((lengths - 1) // k)[:, None]
    return _Rollout(
        images=np.stack(chunks["images"], 1),
        proprio=np.stack(chunks["proprio"], 1),
        texts=texts,
        sample={n: torch.stack([r[n] for r in chunks["sample"]], 1) for n in chunks["sample"][0]},
        logp=torch.stack(chunks["logp"], 1),
        value=torch.stack(chunks["value"], 1),
        reward=torch.as_tensor(reward, dtype=torch.float32),
        mask=torch.as_tensor(mask, dtype=torch.float32),
        actions=np.concatenate(executed, 1)[:, :t_max],
        lengths=lengths,
        success=ok,
        env_steps=int(lengths.sum()),
        seconds=seconds,
    )


def _model_batch(
    processor: HoverflyVLAProcessor,
    images: np.ndarray,
    proprio: np.ndarray,
    texts: list[str],
    width: int,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Model inputs from side-by-side camera images [B, h, W · cams, 3], raw proprio [B, Ds]."""
    cams = processor.config.cameras
    obs = {cam: images[..., i * width : (i + 1) * width, :] for i, cam in enumerate(cams)}
    return {key: v.to(device) for key, v in processor(obs, proprio, texts).items()}


# -- run folder ------------------------------------------------------------------------------------
def _optimizer(cfg: RLConfig, model: HoverflyVLA) -> torch.optim.AdamW:
    value = list(model.value_head.parameters())
    ids = {id(p) for p in value}
    policy = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": policy, "lr": cfg.lr}, {"params": value, "lr": cfg.value_lr}]
    return torch.optim.AdamW(groups, weight_decay=0.0, betas=(0.9, 0.999))


# -- training --------------------------------------------------------------------------------------
@dataclass
class _Run:
    cfg: RLConfig
    out: Path
    record: dict[str, Any]
    env_info: dict[str, Any]
    model: HoverflyVLA
    reference: HoverflyVLA
    processor: HoverflyVLAProcessor
    optimizer: torch.optim.AdamW
    anchor: Any  # frames.Frames of the RL-Co demonstrations, or None
    replay: rft.Replay
    """rft: the successful frames of every iteration so far."""
    compiler_options: tuple = ()
    ema: HoverflyVLA | None = None
    """The weights' moving average (`RLConfig.ema_decay` > 0), or None."""
    iteration: int = 0

    @classmethod
    def create(cls, cfg: RLConfig) -> _Run:
        out = Path(cfg.out)
        init = resolve_checkpoint(cfg.init).resolve()
        device = torch.device(cfg.device)
        model, processor = load_checkpoint(init, device)
        reference, _ = load_checkpoint(init, device)
        reference.eval().requires_grad_(False)
        state = load_train_state(init) or {}
        if "env_info" not in state:
            raise ValueError(f"{init}: train_state.pt holds no env info (not an SFT/RL checkpoint)")
        env_info = json.loads(state["env_info"])
        trained_in = (env_info.get("collect") or {}).get("task")
        if trained_in != cfg.task:
            raise ValueError(
                f"RLConfig.task: {cfg.task!r}, but {init} was trained on {trained_in!r} data"
            )
        # the resolved start (the newest checkpoint of an SFT run folder, say) is part of the config
        record = {"rl": cfg.to_dict() | {"init": str(init)}, "model": model.config.to_dict()}
        _refuse_changed_config(
            out / "rl_config.json", "rl", record, _RESUMABLE, RLConfig().to_dict()
        )
        anchor = None
        if cfg.sft_coef > 0:
            from vla.dataset import LeRobotDataset

            anchor = load_frames([LeRobotDataset(cfg.sft_data)], model.config, device)
        ema = make_ema(model, cfg.ema_decay)
        optimizer = _optimizer(cfg, model)
        replay = rft.Replay(model.config.cameras, device)
        run = (cfg, out, record, env_info, model, reference, processor, optimizer, anchor, replay)
        return cls(*run, ema=ema)

    @property
    def policy(self) -> HoverflyVLA:
        """What is evaluated and checkpointed: the moving average if there is one."""
        return self.model if self.ema is None else self.ema

    def save(self) -> Path:
        state = {
            "iteration": self.iteration,
            "optimizer": self.optimizer.state_dict(),
            "rl_config": json.dumps(self.record),
            "env_info": json.dumps(self.env_info),
        } | trained_weights(self.ema, self.model)
        path = self.out / "checkpoints" / f"iter_{self.iteration:06d}"
        save_checkpoint(path, self.policy, self.processor, state)
        prune_checkpoints(self.out, self.cfg.keep_checkpoints)
        return path

    def resume(self, path: Path) -> None:
        state = load_train_state(path)
        if state is None:
            raise ValueError(f"{path}: no train_state.pt to resume from")
        loaded, _ = load_checkpoint(path, self.model.patch_pos.device)
        restore_weights(self.model, self.ema, loaded, state, path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
        if self.cfg.algo == "rft":
            rft.load_replay(self.out, self.iteration, self.replay)

    def evaluate(self) -> dict[str, Any]:
        self.policy.eval()
        result = _evaluate(
            self.policy,
            self.processor,
            self.env_info,
            self.cfg.eval_episodes,
            _EVAL_SEED + self.cfg.seed,
            self.cfg.max_steps,
            dict(self.compiler_options),
        )
        row = {"iteration": self.iteration} | {k: result[k] for k in _EVAL_COLUMNS}
        _append_csv(self.out / "eval.csv", ("iteration", *_EVAL_COLUMNS), row)
        return result

    def step(self) -> dict[str, float]:
        """One iteration: rollout with the current policy, then the updates."""
        cfg, it = self.cfg, self.iteration
        seed = int(np.random.SeedSequence([cfg.seed, it]).generate_state(1)[0])
        self.model.eval()
        t0 = time.perf_counter()
        group = 1 if cfg.algo == "ppo" else cfg.group_size
        ro = _rollout(
            self.model,
            self.processor,
            self.env_info,
            cfg.num_envs,
            group,
            seed,
            cfg.max_steps,
            cfg.dense_reward_coef,
            self.compiler_options,
            cfg.ratio,
            cfg.fpo_draws,
        )
        t1 = time.perf_counter()
        kl_ref = self._kl_to_reference(ro)
        nan = float("nan")
        if cfg.algo == "rft":
            updates, groups_kept = rft.update(self, ro, group, seed)
        else:
            adv, returns, valid, groups_kept = self._advantages(ro)
            updates = self._update(ro, adv, returns, valid, seed, it < self._warmup())
        return {
            "iteration": it + 1,
            "train_success": float(ro.success.mean()),
            "mean_return": float((ro.reward * ro.mask).sum(1).mean()),
            "chunks": int(ro.mask.sum()),
            "env_steps": ro.env_steps,
            "groups_kept": groups_kept,
            "kl_ref": kl_ref,
            "entropy": _noise_entropy(self.model) if cfg.ratio == "flow_noise" else nan,
            "replay_frames": len(self.replay),
            "rollout_s": t1 - t0,
            "render_s": ro.seconds["render"],
            "model_s": ro.seconds["model"],
            "sim_s": ro.seconds["sim"],
            "update_s": time.perf_counter() - t1,
        } | updates

    def _advantages(self, ro: _Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """PPO / GRPO: advantages, returns, valid chunks [B, T] and the share of groups kept."""
        cfg = self.cfg
        if cfg.algo == "ppo":
            adv, returns = compute_gae(ro.reward, ro.value, ro.mask, cfg.gamma, cfg.gae_lambda)
            valid = ro.mask > 0
            a = adv[valid]
            return (adv - a.mean()) / (a.std() + 1e-8), returns, valid, float("nan")
        outcome = (ro.reward * ro.mask).sum(1)
        ep_adv, keep = compute_group_advantages(outcome, cfg.group_size, cfg.dynamic_sampling)
        adv = ep_adv[:, None].expand_as(ro.mask).clone()
        valid = (ro.mask > 0) & keep[:, None]
        kept = float(keep.reshape(-1, cfg.group_size)[:, 0].float().mean())
        return adv, torch.zeros_like(adv), valid, kept

    def _warmup(self) -> int:
        return self.cfg.value_warmup_iterations if self.cfg.algo == "ppo" else 0

    def _kl_to_reference(self, ro: _Rollout) -> float:
        """KL(π_old ‖ π_SFT) on the rollout's valid chunks."""
        b_idx, t_idx = torch.nonzero(ro.mask > 0, as_tuple=True)
        total, n = 0.0, len(b_idx)
        for s in range(0, n, self.cfg.minibatch_size):
            bi, ti = b_idx[s : s + self.cfg.minibatch_size], t_idx[s : s + self.cfg.minibatch_size]
            batch = self._batch(ro, bi, ti)
            with torch.no_grad():
                logp_ref = _score(self.reference, batch, self._record(ro, bi, ti))
            total += float(_kl_k3(ro.logp[bi, ti].to(self._dev), logp_ref)) * len(bi)
        return total / max(n, 1)

    @property
    def _dev(self) -> torch.device:
        return self.model.patch_pos.device

    def _record(self, ro: _Rollout, bi: torch.Tensor, ti: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: v[bi, ti].to(self._dev) for name, v in ro.sample.items()}

    def _batch(self, ro: _Rollout, bi: torch.Tensor, ti: torch.Tensor) -> dict[str, torch.Tensor]:
        bi_np, ti_np = bi.numpy(), ti.numpy()
        texts = [ro.texts[i] for i in bi_np]
        width = ro.images.shape[3] // len(self.model.config.cameras)
        return _model_batch(
            self.processor,
            ro.images[bi_np, ti_np],
            ro.proprio[bi_np, ti_np],
            texts,
            width,
            self._dev,
        )

    def _update(
        self,
        ro: _Rollout,
        adv: torch.Tensor,
        returns: torch.Tensor,
        valid: torch.Tensor,
        seed: int,
        warmup: bool,
    ) -> dict[str, float]:
        cfg, model, dev = self.cfg, self.model, self._dev
        model.train()
        rng = np.random.default_rng(seed)
        anchor_gen = torch.Generator(dev).manual_seed(seed)
        b_idx, t_idx = torch.nonzero(valid, as_tuple=True)
        sums = {k: 0.0 for k in ("policy_loss", "value_loss", "sft_loss", "approx_kl", "clip_frac")}
        updates, stop = 0, False
        for _ in range(cfg.epochs):
            perm = torch.as_tensor(rng.permutation(len(b_idx)))
            for s in range(0, len(perm), cfg.minibatch_size):
                sel = perm[s : s + cfg.minibatch_size]
                bi, ti = b_idx[sel], t_idx[sel]
                batch = self._batch(ro, bi, ti)
                cache = model.embed_prefix(batch)
                loss = torch.zeros((), device=dev)
                stats = {"approx_kl": torch.zeros(()), "clip_frac": torch.zeros(())}
                policy_loss = torch.zeros(())
                if not warmup:
                    logp = _score(model, batch, self._record(ro, bi, ti), cache)
                    policy_loss, stats = compute_policy_loss(
                        logp,
                        ro.logp[bi, ti].to(dev),
                        adv[bi, ti].to(dev),
                        cfg.clip_low,
                        cfg.clip_high,
                    )
                    loss = loss + policy_loss
                value_loss = torch.zeros(())
                if cfg.algo == "ppo":
                    pooled = cache.pooled.detach() if warmup else cache.pooled
                    v = model.value_head(pooled)[:, 0]
                    value_loss = (v - returns[bi, ti].to(dev)).pow(2).mean()
                    loss = loss + cfg.vf_coef * value_loss
                sft_loss = torch.zeros(())
                if not warmup:
                    sft_loss = self.anchor_loss(rng, anchor_gen)
                    loss = loss + cfg.sft_coef * sft_loss
                self.optimizer_step(loss)
                updates += 1
                for key, v in (
                    ("policy_loss", policy_loss),
                    ("value_loss", value_loss),
                    ("sft_loss", sft_loss),
                    *stats.items(),
                ):
                    sums[key] += float(v.detach())
                if cfg.target_kl is not None and float(stats["approx_kl"]) > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
        return {k: v / max(updates, 1) for k, v in sums.items()} | {"updates": updates}

    def anchor_loss(self, rng: np.random.Generator, gen: torch.Generator) -> torch.Tensor:
        """RL-Co: the flow-matching loss of a batch of held demonstrations (0 without them)."""
        if self.anchor is None:
            return torch.zeros((), device=self._dev)
        idx = rng.integers(0, len(self.anchor.states), self.cfg.sft_batch_size)
        batch = gather_batch(self.anchor, self.processor, idx, self._dev)
        return self.model.flow_matching_loss(batch, generator=gen)

    def optimizer_step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        update_ema(self.ema, self.model, self.cfg.ema_decay)


def train_rl(
    cfg: RLConfig,
    progress: bool = True,
    callback: Callable[[int, dict[str, float]], None] | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> Path:
    """Trains (or resumes) the RL run `cfg.out` to `cfg.iterations`; returns its final
    checkpoint folder. Evaluates the start (iteration 0), every `eval_every` iterations and the
    end; writes learning_curve.png. `callback(iteration, metrics)` runs after each iteration's
    metrics are logged (an exception there stops training like a kill: the run resumes from its
    last checkpoint); `compiler_options` go to XLA (e.g. `vla.collect.FAST_COMPILE`)."""
    cfg.validate()
    run = _Run.create(cfg)
    run.compiler_options = tuple(sorted((compiler_options or {}).items()))
    last = latest_checkpoint(run.out)
    if last is not None:
        run.resume(last)
    run.out.mkdir(parents=True, exist_ok=True)
    atomic_write(run.out / "rl_config.json", json.dumps(run.record, indent=2) + "\n")
    _truncate_csv(run.out / "metrics.csv", run.iteration)
    _truncate_csv(run.out / "eval.csv", run.iteration)
    if run.iteration == 0 and not (run.out / "eval.csv").is_file():
        run.evaluate()
    final = last if last is not None and run.iteration >= cfg.iterations else None
    with _progress(progress) as bar:
        task = bar.add_task(f"vla {cfg.algo}", total=cfg.iterations, completed=run.iteration)
        while run.iteration < cfg.iterations:
            metrics = run.step()
            run.iteration += 1
            _append_csv(run.out / "metrics.csv", _METRICS, metrics)
            desc = f"vla {cfg.algo} success {metrics['train_success']:.2f}"
            bar.update(task, completed=run.iteration, description=desc)
            if callback is not None:
                callback(run.iteration, metrics)
            end = run.iteration == cfg.iterations
            if (cfg.eval_every and run.iteration % cfg.eval_every == 0) or end:
                run.evaluate()
            if run.iteration % cfg.checkpoint_every == 0 or end:
                final = run.save()
    plot_learning_curve(run.out)
    return final if final is not None else run.save()


def summarize(out: str | os.PathLike) -> dict[str, Any]:
    """The start and final evaluation of an RL run folder: checkpoint, start_success_rate,
    success_rate, episodes, iterations."""
    out = Path(out)
    path = out / "eval.csv"
    rows = _read_rows(path) if path.is_file() else []
    if not rows:
        raise FileNotFoundError(f"{path}: no evaluations yet")
    return {
        "checkpoint": str(latest_checkpoint(out)),
        "start_success_rate": float(rows[0]["success_rate"]),
        "success_rate": float(rows[-1]["success_rate"]),
        "episodes": int(rows[-1]["episodes"]),
        "iterations": int(rows[-1]["iteration"]),
    }


def _read_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


def plot_learning_curve(out: str | os.PathLike) -> Path:
    """learning_curve.png of an RL run folder: training-rollout and evaluation success."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, col, label in (
        ("metrics.csv", "train_success", "training rollouts"),
        ("eval.csv", "success_rate", "evaluation (deterministic)"),
    ):
        path = out / name
        if path.is_file():
            data = np.genfromtxt(path, delimiter=",", names=True)
            data = np.atleast_1d(data)
            ax.plot(data["iteration"], data[col], marker="o", ms=3, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "learning_curve.png"
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
