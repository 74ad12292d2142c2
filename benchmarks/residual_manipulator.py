"""Residual RL on the arm under perturbations (issue: "a scripted pick-and-place base that fails
under pose noise and perturbations, lifted by a residual trained in simulation with pose noise and
dropout"; target: ≥ 30 points of success over the base, after the object-centric residual-RL
paper's 42 % → 76 %).

Arms, at equal env samples for the two learners, all evaluated on the same perturbed episodes:
- base: the scripted pick-and-place policy (`sim.manipulator.scripted`) alone;
- residual: PPO on `ResidualWrapper(perturbed env, scripted base)`, trained with extra object-pose
  noise and dropout on the residual's observation (`ObsAugmentation`), evaluated without them;
- scratch: PPO on the perturbed env alone;
- nominal: the base (and the trained residual) on the unperturbed env, for reference.

Env: `arm-pick-place` with cartesian actions, the default domain randomization, and
`sim.manipulator.perturb.Perturbation` (object-pose bias, noise and missed detections; a push of
the cube during the approach). Success: the cube within `success_threshold` of the goal at the
last step of the episode (`algos.evaluate.summarize`). Progress goes to stderr (the per-step
success there depends on the phase of the episode, as all envs start together); stdout gets one
JSON object, which `--out` also receives, rewritten after every arm.

On one H200 (jax 0.11.2): ~125k env steps/s in training with 2048 envs; ~90–135 s to compile a
learner, ~45–60 s per evaluation (mostly compilation). So 20M steps ≈ 6 min per PPO arm with its
two evaluations, ~15 min for everything:

  python benchmarks/residual_manipulator.py --out benchmarks/results/residual_manipulator.json
  python benchmarks/residual_manipulator.py --timesteps 4096 --num-envs 32 --episodes 16 \
      --no-eval-nominal                              # CPU smoke test, ~5 min on 2 cores
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Literal

import jax
import tyro

from algos.evaluate import rollout, summarize
from algos.ppo import PPOConfig, make_train
from algos.residual import ObsAugmentation, ResidualScale, ResidualWrapper, zero_policy
from algos.residual.wrapper import field_layout
from policies import NetworkConfig, make_policy
from sim import Env, make_env
from sim.manipulator import ArmConfig, RandomizationConfig, RewardConfig, SceneConfig, obs_fields
from sim.manipulator.perturb import Perturbation, PerturbationConfig
from sim.manipulator.scripted import ScriptedConfig, make_scripted_base

Arm = Literal["base", "residual", "scratch"]
POSE_FIELDS = ("cube_pos", "cube_minus_tcp", "goal_minus_cube")
"""Object-pose fields of the arm observation that the augmentation corrupts."""


@dataclasses.dataclass(frozen=True)
class Args:
    """Scripted base vs PPO residual vs PPO from scratch on the perturbed arm."""

    timesteps: int = 20_000_000
    """Env steps per PPO arm (replaces `ppo.total_timesteps`)."""
    num_envs: int = 2048
    """Parallel training envs (replaces `ppo.num_envs`)."""
    episodes: int = 1024
    """Evaluation episodes per arm (the same fixed episodes for every arm)."""
    eval_seed: int = 12345
    """Key of the evaluation episodes."""
    seed: int = 0
    """Key of the training runs."""
    arms: tuple[Arm, ...] = ("base", "residual", "scratch")
    """Arms to run."""
    eval_nominal: bool = True
    """Also evaluate the base and the trained residual without perturbations."""
    scale: float = 0.5
    """Residual scale: |applied − base| ≤ scale per action component."""
    scale_start: float | None = None
    """Residual scale at the start of training (None: `scale` throughout)."""
    ramp: float = 0.0
    """Fraction of training over which the scale moves from `scale_start` to `scale`."""
    residual_log_std: float = -1.5
    """Initial log σ of the residual's Gaussian head (small: the untrained residual ≈ the base)."""
    aug_noise: float = 0.005
    """σ of the extra object-pose noise on the residual's observation in training, m."""
    aug_dropout: float = 0.1
    """Per-step probability that a pose field of the residual's observation is held (training)."""
    episode_steps: int = 250
    """Episode length, control steps (50 Hz)."""
    perturbation: PerturbationConfig = PerturbationConfig()
    randomization: RandomizationConfig = RandomizationConfig()
    scene: SceneConfig = SceneConfig()
    """Physics options (e.g. `--scene.iterations`, `--scene.max-contact-points`)."""
    reward: RewardConfig = RewardConfig()
    """Reward terms of the PPO arms (`--reward.grasp 0`: the reward before the grasp term)."""
    scripted: ScriptedConfig = ScriptedConfig()
    ppo: PPOConfig = PPOConfig(
        unroll_length=16,
        num_minibatches=4,
        learning_rate=1e-3,
        gamma=0.97,
        network=NetworkConfig(actor_hidden=(128, 128), critic_hidden=(256, 256), init_log_std=-0.5),
    )
    """PPO settings of both learners (the arm preset's; `timesteps`, `num_envs` replace theirs)."""
    out: Path | None = None
    """Also write the JSON here (rewritten after every arm)."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def evaluate(env: Env, policy_fn, episodes: int, steps: int, seed: int) -> dict:
    """Success rate etc. of `policy_fn` over `episodes` fixed episodes (`algos.evaluate`)."""
    run = jax.jit(
        lambda key: rollout(env, policy_fn, key, episodes, steps),
        compiler_options=env.compiler_options,
    )
    t0 = time.perf_counter()
    out = summarize(run(jax.random.key(seed)), 1, 0.0)
    return {**out, "eval_s": time.perf_counter() - t0}


def train_ppo(env: Env, ppo: PPOConfig, episode_steps: int, key: jax.Array, name: str):
    """Trains PPO on `env`; returns (deterministic policy, timing and last training metrics)."""
    trainer = make_train(ppo, env, episode_steps)
    opts = env.compiler_options
    t0 = time.perf_counter()
    ts = jax.jit(trainer.init, compiler_options=opts)(key)
    update = jax.jit(trainer.update, donate_argnums=0, compiler_options=opts)
    ts, metrics = update(ts)
    jax.block_until_ready(ts)
    t1 = time.perf_counter()
    every = max(1, ppo.num_updates // 20)
    for i in range(1, ppo.num_updates):
        ts, metrics = update(ts)
        if (i + 1) % every == 0 or i + 1 == ppo.num_updates:
            m = jax.device_get(metrics)
            log(
                f"[{name}] update {i + 1}/{ppo.num_updates}  steps {(i + 1) * ppo.batch_size:,}  "
                f"success/step {float(m['success']):.3f}  return {float(m['episode/return']):.1f}"
                f"  {time.perf_counter() - t0:.0f} s"
            )
    jax.block_until_ready(ts)
    t2 = time.perf_counter()
    m = jax.device_get(metrics)
    steps = ppo.num_updates * ppo.batch_size
    info = {
        "env_steps": steps,
        "compile_and_first_update_s": t1 - t0,
        "train_s": t2 - t0,
        "steps_per_s": (steps - ppo.batch_size) / max(t2 - t1, 1e-9),
        "final_train_success_per_step": float(m["success"]),
        "final_train_episode_return": float(m["episode/return"]),
    }
    return make_policy(trainer.network, ts.params, deterministic=True), info


def write(doc: dict, path: Path | None) -> str:
    """`doc` as indented JSON, also written to `path` (if any)."""
    text = json.dumps(doc, indent=2)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text


def run(args: Args) -> dict:
    """Runs the selected arms; returns the result document (written to `args.out` after each
    arm, so that an interrupted run keeps the finished arms)."""
    arm_cfg = ArmConfig(
        task="pick_place",
        action_space="cartesian",
        episode_steps=args.episode_steps,
        scene=args.scene,
        reward=args.reward,
    )
    ppo = dataclasses.replace(args.ppo, total_timesteps=args.timesteps, num_envs=args.num_envs)
    nominal = make_env("arm-pick-place", arm_cfg, args.randomization)
    perturbed = Perturbation(nominal, args.perturbation)
    base = make_scripted_base(perturbed.unwrapped, args.scripted)
    start = args.scale if args.scale_start is None else args.scale_start
    scale = ResidualScale(start=start, end=args.scale, ramp=args.ramp)
    aug = ObsAugmentation(POSE_FIELDS, args.aug_noise, args.aug_dropout, targets=("residual",))
    layout = field_layout(obs_fields(perturbed.action_size))
    train_env = ResidualWrapper(perturbed, base, scale, aug, layout)
    eval_env = ResidualWrapper(perturbed, base, scale)  # no augmentation at evaluation
    nominal_env = ResidualWrapper(nominal, base, scale)
    n, t, seed = args.episodes, args.episode_steps, args.eval_seed
    key_residual, key_scratch = jax.random.split(jax.random.key(args.seed))

    results: dict = {}
    doc = {
        "benchmark": "residual_manipulator",
        "task": "arm-pick-place",
        "args": json.loads(json.dumps(dataclasses.asdict(args), default=str)),
        "ppo": {**dataclasses.asdict(ppo), "num_updates": ppo.num_updates},
        "residual_scale": dataclasses.asdict(scale),
        "augmentation": dataclasses.asdict(aug),
        "results": results,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }

    def done(arm: str) -> None:
        log(f"[{arm}] {results[arm]}")
        if "base" in results and "residual" in results:
            lift = results["residual"]["success_rate"] - results["base"]["success_rate"]
            results["residual_lift_points"] = 100.0 * lift
        write(doc | {"loadavg": os.getloadavg()}, args.out)

    zero = zero_policy(perturbed.action_size)
    if "base" in args.arms:
        log("[base] evaluating")
        results["base"] = evaluate(eval_env, zero, n, t, seed)
        if args.eval_nominal:
            nom = evaluate(nominal_env, zero, n, t, seed)
            results["base"]["nominal_success_rate"] = nom["success_rate"]
        done("base")
    if "residual" in args.arms:
        net = dataclasses.replace(ppo.network, init_log_std=args.residual_log_std)
        residual_ppo = dataclasses.replace(ppo, network=net)
        policy, info = train_ppo(train_env, residual_ppo, t, key_residual, "residual")
        results["residual"] = {**evaluate(eval_env, policy, n, t, seed), **info}
        if args.eval_nominal:
            nom = evaluate(nominal_env, policy, n, t, seed)
            results["residual"]["nominal_success_rate"] = nom["success_rate"]
        done("residual")
    if "scratch" in args.arms:
        policy, info = train_ppo(perturbed, ppo, t, key_scratch, "scratch")
        results["scratch"] = {**evaluate(perturbed, policy, n, t, seed), **info}
        done("scratch")
    return doc | {"loadavg": os.getloadavg()}


def main(argv: list[str] | None = None) -> dict:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0])
    doc = run(args)
    print(write(doc, args.out))
    return doc


if __name__ == "__main__":
    main()
