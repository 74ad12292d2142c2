"""Time to a hover policy with ≥ 95 % eval success, wall clock including compilation.

Trains the preset of `--algo` (PPO or APG) for each seed, evaluates the deterministic policy with
the run's eval protocol every `--eval-every` updates (evaluation time is excluded from the training
clock and reported apart), and prints one JSON object: per seed the training seconds and env steps
at the first evaluation that reaches the threshold (null if none), compile time, final success.
Peer: the L2F paper's TD3 recipe, 26.8 s wall on our 2-core CPU (../shared/reference/crazyflie.md),
quoted as a reference figure (RLtools is not packaged; it is not re-run here).

  python benchmarks/time_to_success.py --preset cpu --seeds 0 1 2 --out tts_cpu.json
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from algos import get_preset
from algos.config_io import override
from algos.evaluate import eval_steps, rollout, summarize
from algos.run_folder import LEARNERS
from policies import make_policy
from sim import make_env

L2F_TD3_SECONDS = 26.8


def run_seed(cfg, seed: int, eval_every: int, threshold: float, stop: bool = False) -> dict:
    env = make_env(cfg.task, cfg.env, cfg.randomization)
    trainer = LEARNERS[cfg.algo].make_train(cfg.learner, env, cfg.env.episode_steps)
    steps, settle = eval_steps(cfg.eval, cfg.env.ctrl_dt)

    @jax.jit
    def evaluate(params):
        policy = make_policy(trainer.network, params, deterministic=True)
        return rollout(env, policy, jax.random.key(cfg.eval.seed), cfg.eval.episodes, steps)

    t0 = time.perf_counter()
    update = jax.jit(trainer.update, donate_argnums=0)
    ts = jax.jit(trainer.init)(jax.random.key(seed))
    ts, _ = update(ts)
    jax.block_until_ready(ts)
    compile_s = time.perf_counter() - t0
    eval_s, reached, curve = 0.0, None, []
    for i in range(1, cfg.learner.num_updates):
        ts, _ = update(ts)
        if (i + 1) % eval_every and i + 1 != cfg.learner.num_updates:
            continue
        jax.block_until_ready(ts)
        t_eval = time.perf_counter()
        summary = summarize(evaluate(ts.params), settle, cfg.eval.tolerance)
        eval_s += time.perf_counter() - t_eval
        train_s = time.perf_counter() - t0 - eval_s
        env_steps = (i + 1) * cfg.steps_per_update
        curve.append([round(train_s, 2), env_steps, summary["success_rate"]])
        if reached is None and summary["success_rate"] >= threshold:
            reached = {"train_seconds": round(train_s, 2), "env_steps": env_steps}
            if stop:
                break
    return {
        "seed": seed,
        "compile_and_first_update_s": round(compile_s, 2),
        "reached": reached,
        "final": summary,
        "eval_seconds": round(eval_s, 2),
        "updates": i + 1,
        "ms_per_update": round((train_s - compile_s) / i * 1e3, 2),
        "curve": curve,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="quadrotor-hover")
    p.add_argument("--preset", default="cpu")
    p.add_argument("--algo", default="ppo", choices=["ppo", "apg"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--eval-every", type=int, default=100, help="updates between evaluations")
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a TrainConfig field (dotted path, JSON value)",
    )
    p.add_argument(
        "--stop",
        action="store_true",
        help="end a seed at its first evaluation ≥ the threshold ('final' is then that one)",
    )
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    cfg = override(get_preset(a.task, a.preset, a.algo), a.set)
    seeds = [run_seed(cfg, s, a.eval_every, a.threshold, a.stop) for s in a.seeds]
    times = [s["reached"]["train_seconds"] for s in seeds if s["reached"]]
    result = {
        "benchmark": "time_to_success",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "task": a.task,
        "preset": a.preset,
        "algo": a.algo,
        "overrides": a.set,
        "threshold": a.threshold,
        "seeds": seeds,
        "seeds_reached": len(times),
        "median_seconds": sorted(times)[len(times) // 2] if times else None,
        "peer": {"name": "L2F TD3 recipe (RLtools), reference figure", "seconds": L2F_TD3_SECONDS},
        "ratio_peer_over_ours": round(L2F_TD3_SECONDS / sorted(times)[len(times) // 2], 3)
        if times
        else None,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return result


if __name__ == "__main__":
    main()
