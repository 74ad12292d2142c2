"""Residual RL on the quadrotor under heavy randomization (issue 4): the cascaded base controller
alone, a residual on top of it, and a policy from scratch, at equal env samples; both trained by
`--algo` (PPO's or APG's CPU preset, its budget set by `--timesteps`).

Heavy randomization (`sim.quadrotor.HEAVY` and `heavy_disturbances`): mass +30 %, motor time
constants ×2 (each drawn ±10 % around the shifted value), disturbances ×3; `quadrotor-hover`'s
wide initial states.
Each arm is evaluated with the evaluation protocol (`algos.EvalConfig`: 1000 episodes of 5 s,
deterministic policy, success = never terminated and mean position error over the last 2 s ≤ 0.1 m)
on the same episodes. Prints and writes (`--out`) one JSON object.

  python benchmarks/residual_quadrotor.py --timesteps 4000000 --out results.json   # CPU, minutes
  python benchmarks/residual_quadrotor.py --timesteps 26000000                     # the full budget
  python benchmarks/residual_quadrotor.py --algo apg --timesteps 3200000            # APG
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax

from algos import EvalConfig, get_preset
from algos.evaluate import eval_steps, rollout, summarize
from algos.residual import ResidualConfig, ResidualScale, zero_policy
from algos.run_folder import LEARNERS, make_train_env
from policies import make_policy
from sim import Env
from sim.quadrotor import HEAVY, ControllerConfig, heavy_disturbances


def evaluate(env: Env, policy_fn, cfg: EvalConfig) -> dict:
    steps, settle = eval_steps(cfg, env.dt)
    run = jax.jit(lambda key: rollout(env, policy_fn, key, cfg.episodes, steps))
    return summarize(run(jax.random.key(cfg.seed)), settle, cfg.tolerance)


def train(algo: str, learner, env: Env, episode_steps: int, seed: int) -> tuple[dict, dict]:
    """Trains `learner` (a PPO or APG config) on `env`; returns (deterministic policy, timing)."""
    trainer = LEARNERS[algo].make_train(learner, env, episode_steps)
    t0 = time.perf_counter()
    ts = jax.jit(trainer.init)(jax.random.key(seed))
    update = jax.jit(trainer.update, donate_argnums=0)
    ts, metrics = update(ts)
    jax.block_until_ready(ts)
    t1 = time.perf_counter()
    for _ in range(learner.num_updates - 1):
        ts, metrics = update(ts)
    jax.block_until_ready(ts)
    t2 = time.perf_counter()
    timing = {
        "compile_and_first_update_s": t1 - t0,
        "train_s": t2 - t0,
        "env_steps": learner.num_updates * learner.steps_per_update,
        "final_train_episode_length": float(metrics["episode/length"]),
    }
    return make_policy(trainer.network, ts.params, deterministic=True), timing


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", choices=["ppo", "apg"], default="ppo")
    ap.add_argument("--timesteps", type=int, default=4_000_000, help="env steps per trained arm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=0.3, help="residual scale (end of schedule)")
    ap.add_argument("--scale-start", type=float, default=None, help="scale at progress 0")
    ap.add_argument("--ramp", type=float, default=0.0, help="progress over which scale ramps")
    ap.add_argument("--episodes", type=int, default=1000, help="evaluation episodes per arm")
    ap.add_argument("--arms", nargs="+", default=["base", "residual", "scratch"])
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = ap.parse_args(argv)

    preset = get_preset("quadrotor-hover", "cpu", args.algo)
    learner = dataclasses.replace(preset.learner, total_timesteps=args.timesteps)
    episode_steps = preset.env.episode_steps
    eval_cfg = dataclasses.replace(preset.eval, episodes=args.episodes)
    start = args.scale if args.scale_start is None else args.scale_start
    scale = ResidualScale(start=start, end=args.scale, ramp=args.ramp)
    heavy = dataclasses.replace(preset, env=heavy_disturbances(preset.env), randomization=HEAVY)
    env = make_train_env(heavy)
    residual = ResidualConfig(base="controller", scale=scale)
    residual_env = make_train_env(dataclasses.replace(heavy, residual=residual))

    results: dict = {}
    if "base" in args.arms:
        results["base"] = evaluate(residual_env, zero_policy(env.action_size), eval_cfg)
    for arm, arm_env in (("residual", residual_env), ("scratch", env)):
        if arm in args.arms:
            policy, timing = train(args.algo, learner, arm_env, episode_steps, args.seed)
            results[arm] = {**evaluate(arm_env, policy, eval_cfg), **timing}
        print(json.dumps({arm: results.get(arm)}), file=sys.stderr, flush=True)
    doc = {
        "benchmark": "residual_quadrotor",
        "task": "quadrotor-hover",
        "randomization": dataclasses.asdict(HEAVY),
        "disturbance": dataclasses.asdict(heavy.env.disturbance),
        "controller": dataclasses.asdict(ControllerConfig()),
        "residual_scale": dataclasses.asdict(scale),
        "algo": args.algo,
        args.algo: {**dataclasses.asdict(learner), "num_updates": learner.num_updates},
        "eval": dataclasses.asdict(eval_cfg),
        "seed": args.seed,
        "results": results,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "loadavg": os.getloadavg(),
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return doc


if __name__ == "__main__":
    main()
