"""Success of the scripted expert (`vla.collect.make_rollout`) per pick-place goal target: which
named targets can the demonstrations reach? Each target gets the same `--episodes` randomized
start states (reset seeds from `--seed`) in the demonstrations' env (`vla.collect.
collect_arm_config`, domain randomization on), with only that target as the goal.

  python benchmarks/vla_expert_targets.py --targets 0.65,0,0.1 0.62,0,0.1 0.6,0,0.1

A target is x,y,height (world m; height above the resting cube centre); default: `TARGETS`.
stdout: one JSON object (also written to --out): per target the success rate (cube within the
threshold at any step of `--max-steps`) and the median and 90th percentile step of the first
success. ~25 s per target on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def _target(text: str) -> tuple[float, float, float]:
    values = tuple(float(v) for v in text.split(","))
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"a target is x,y,height, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> dict:
    from vla.collect import TARGETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", type=_target, nargs="+", default=list(TARGETS))
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=250)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from sim_throughput import emit_json

    from sim import make_env
    from sim.manipulator import RandomizationConfig
    from vla.collect import CollectConfig, collect_arm_config, make_rollout

    arm = collect_arm_config(CollectConfig(max_steps=args.max_steps))
    seeds = np.random.default_rng(args.seed).integers(0, 2**31 - 1, args.episodes, np.uint32)
    rows = []
    for target in args.targets:
        cfg = dataclasses.replace(arm, init=dataclasses.replace(arm.init, goal_targets=(target,)))
        env = make_env("arm-pick-place", cfg, RandomizationConfig())
        run = jax.jit(make_rollout(env, args.max_steps), compiler_options=env.compiler_options)
        success = np.asarray(run(jnp.asarray(seeds))["success"]) > 0  # [T, B]
        first = success.argmax(0)[success.any(0)]
        rows.append(
            {
                "target": list(target),
                "success_rate": round(float(success.any(0).mean()), 3),
                "first_success_step_p50_p90": np.percentile(first, [50, 90]).round(1).tolist()
                if len(first)
                else None,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    result = {
        "benchmark": "vla_expert_targets",
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "episodes": args.episodes,
        "max_steps": args.max_steps,
        "targets": rows,
    }
    return emit_json(result, args.out)


if __name__ == "__main__":
    main()
