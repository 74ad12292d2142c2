"""Per-state success of a VLA checkpoint in arm pick-place: is failure a matter of the flow
noise (RL can sharpen it) or of the start state (the policy never solves it)?

The same `--states` reset states are evaluated `--noise-seeds` times with the closed-loop
evaluator (`vla.sft._evaluate`: the evaluation sampler, Euler ODE from random noise), each time
with other flow noise. Reports each state's success rate, how many states are always solved,
never solved or in between, and the success by goal target. For reference, if every episode
succeeded independently with the overall rate p, the share of "never" states would be
(1 − p)^seeds; it is printed beside the measured one. With `--dataset DEMOS` the states are
those of the dataset's first `--states` episodes (their `reset_seed`s, the cube colours cycled
as there): the policy's success on the scenes it was trained on, against held-out ones
(`--first-state`). `--noise-scale τ` scales the sampler's initial noise (0: the ODE from zero
noise, the same for every noise seed) and `--action-steps K` executes K actions of each chunk
instead of the model's `n_action_steps`. `failures` says where the failed episodes ended: the
tool never reached the cube, reached it but the cube lies on the table at the end (a missed or
lost grasp), or the cube is held up but off the goal. `by_cube_x` is the success by the cube's
start distance from the robot: the near, middle and far thirds of the env's cube range along x
(the wrist camera loses a near cube when the tool overshoots it). `pass_at_k` is the share of
states that k noise draws solve at least once, for k = 1, 2, 4, … up to `--noise-seeds` (the
unbiased estimator of Chen et al. 2021 from each state's successes): what RL that learns from
its own successful samples (RFT, GRPO with groups of k) can reach without new behaviour.
`--branches N` replaces the evaluator's sampler by a search with the simulator as the critic
(`vla.sft._evaluate`): at every chunk each state tries N noise draws from a copy of its env state
and keeps the chunk that succeeds or earns the most shaped reward. What steering the flow noise
chunk by chunk (DSRL, Wagenmaker et al. 2025; value-guided sampling, V-GPS, Nakamoto et al. 2024)
could reach with a perfect one-chunk critic; N times the simulation.

  python benchmarks/vla_state_success.py SFT/checkpoints/step_00015000 --out F.json

stdout: one JSON object (also written to --out). ~1 min per 32 episodes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path


def pass_at_k(successes: list[int], n: int) -> dict[str, float]:
    """{k: share of states solved at least once in k of their n draws} for k = 1, 2, 4, … ≤ n,
    from each state's number of successes (1 − C(n − c, k) / C(n, k), averaged over states)."""
    ks = [2**i for i in range(n.bit_length())]
    return {
        str(k): round(
            sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in successes) / len(successes), 4
        )
        for k in ks
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path, help="VLA checkpoint folder or SFT / RL run folder")
    p.add_argument("--states", type=int, default=32)
    p.add_argument("--noise-seeds", type=int, default=4)
    p.add_argument("--first-state", type=int, default=5000, help="reset seed of the first state")
    p.add_argument(
        "--dataset", type=Path, default=None, help="states of this dataset's first episodes"
    )
    p.add_argument("--noise-scale", type=float, default=1.0)
    p.add_argument("--action-steps", type=int, default=None)
    p.add_argument("--branches", type=int, default=1, help="noise draws searched per chunk")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import numpy as np
    import torch
    from sim_throughput import emit_json

    from vla.checkpoint import load_checkpoint, load_train_state, resolve_checkpoint
    from vla.collect import collect_arm_config, collect_config_from_info
    from vla.dataset import LeRobotDataset
    from vla.sft import _evaluate

    ckpt = resolve_checkpoint(args.checkpoint)
    model, processor = load_checkpoint(ckpt, torch.device(args.device))
    env_info = json.loads(load_train_state(ckpt)["env_info"])
    if args.dataset is None:
        seeds = np.arange(args.first_state, args.first_state + args.states)
    else:
        episodes = LeRobotDataset(args.dataset).episodes[: args.states]
        seeds = np.array([e.metadata["reset_seed"] for e in episodes])
    runs = [
        _evaluate(
            model.eval(),
            processor,
            env_info,
            len(seeds),
            77 + i,
            reset_seeds=seeds,
            noise_scale=args.noise_scale,
            action_steps=args.action_steps,
            branches=args.branches,
        )  # fmt: skip
        for i in range(args.noise_seeds)
    ]
    ok = np.array([r["success"] for r in runs], float)  # [seeds, states]
    field = {k: np.array([r[k] for r in runs]) for k in ("reached_cube", "end_cube_lifted")}
    failed = ok == 0
    per_state = ok.mean(0)
    overall = float(ok.mean())
    arm = collect_arm_config(collect_config_from_info(env_info)).init
    lo, hi = arm.cube_center[0] - arm.cube_range, arm.cube_center[0] + arm.cube_range
    edges = [lo + (hi - lo) / 3, lo + 2 * (hi - lo) / 3]
    band = np.digitize(np.array(runs[0]["cube_start"])[:, 0], edges)  # 0 near, 1 middle, 2 far
    bands = [(name, band == i) for i, name in enumerate(("near", "middle", "far"))]
    by_goal = collections.defaultdict(list)
    for text, rate in zip(runs[0]["instructions"], per_state, strict=True):
        by_goal[text.split()[-2]].append(rate)  # "... on the <goal> target"
    result = {
        "benchmark": "vla_state_success",
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "checkpoint": str(ckpt),
        "states": len(seeds),
        "states_from": str(args.dataset) if args.dataset else f"reset seeds {seeds[0]}…",
        "noise_seeds": args.noise_seeds,
        "success_rate": overall,
        "per_state": per_state.round(3).tolist(),
        "always": int((per_state == 1).sum()),
        "never": int((per_state == 0).sum()),
        "between": int(((per_state > 0) & (per_state < 1)).sum()),
        "pass_at_k": pass_at_k(ok.sum(0).astype(int).tolist(), args.noise_seeds),
        "never_if_independent": round(args.states * (1 - overall) ** args.noise_seeds, 2),
        "by_goal": {g: round(float(np.mean(v)), 3) for g, v in sorted(by_goal.items())},
        "episodes_per_goal": {g: len(v) * args.noise_seeds for g, v in sorted(by_goal.items())},
        "by_cube_x": {n: round(float(per_state[m].mean()), 3) for n, m in bands if m.any()},
        "episodes_per_cube_x": {n: int(m.sum()) * args.noise_seeds for n, m in bands},
        "cube_x_edges_m": [round(e, 4) for e in edges],
        "noise_scale": args.noise_scale,
        "branches": args.branches,
        "action_steps": args.action_steps or model.config.n_action_steps,
        "failures": {
            "episodes": int(failed.sum()),
            "never_reached_cube": int((failed & ~field["reached_cube"]).sum()),
            "cube_on_table_at_end": int(
                (failed & field["reached_cube"] & ~field["end_cube_lifted"]).sum()
            ),
            "cube_held_off_goal": int((failed & field["end_cube_lifted"]).sum()),
        },
    }
    return emit_json(result, args.out)


if __name__ == "__main__":
    main()
