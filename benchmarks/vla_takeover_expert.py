"""The scripted expert taking over from a student VLA (`hoverfly vla collect --student`): how
often does it succeed from the student's states, resuming (`ScriptedPolicy.resume`: a cube the
student holds is carried on to the goal) against restarting from its first phase (the peer: it
opens the gripper above the cube, so a held cube falls; the behaviour until 2026-12-06)?

Both variants run the same reset seeds with the same student and takeover steps (drawn per
episode from `--takeover`), so the student's part is the same; only rollouts where the student
has neither succeeded nor ended before the takeover count (those a collect records from).

  python benchmarks/vla_takeover_expert.py SFT/checkpoints/step_00015000 --takeover 100 200

stdout: one JSON object (also written to --out): per variant the rollouts the expert drove and
won (cube at the goal at any step after the takeover), split by whether the student held the cube
at the takeover, and the ratio resume / restart of the wins. ~2 min per variant for 64 rollouts
on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("student", type=Path, help="VLA checkpoint folder that drives first")
    p.add_argument("--takeover", type=int, nargs=2, default=(100, 200), metavar=("FIRST", "LAST"))
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--first-seed", type=int, default=7000, help="reset seed of the first episode")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from sim_throughput import emit_json

    from sim.manipulator import ScriptedConfig, make_scripted_policy
    from sim.manipulator.scripted import PHASES
    from vla.collect import CollectConfig, make_collect_env, make_rollout

    config = CollectConfig(student=str(args.student), takeover=tuple(args.takeover))
    config.validate()
    env = make_collect_env(config)
    seeds = jnp.arange(args.first_seed, args.first_seed + args.episodes, dtype=jnp.uint32)
    resume = jax.jit(jax.vmap(make_scripted_policy().resume))
    variants = {"resume": ScriptedConfig(), "restart": ScriptedConfig(hold_radius=1e-9)}
    result = {
        "benchmark": "vla_takeover_expert",
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "student": str(args.student),
        "takeover": list(args.takeover),
        "episodes": args.episodes,
    }
    for name, scripted in variants.items():
        rollout = make_rollout(env, config.max_steps, config.student, config.takeover, scripted)
        tr = jax.device_get(jax.jit(rollout, compiler_options=env.compiler_options)(seeds))
        first, b = np.asarray(tr["takeover"]), np.arange(args.episodes)
        success, done = np.asarray(tr["success"]) > 0, np.asarray(tr["done"]) > 0
        steps = np.arange(success.shape[0])[:, None]
        before = steps < first[None]
        drove = ~((success | done) & before).any(0)
        won = drove & (success & ~before).any(0)
        at_takeover = jnp.asarray(np.asarray(tr["obs"])[first, b])
        held = np.asarray(resume(at_takeover).phase) == PHASES.index("carry")
        result[name] = {
            split: {"drove": int((drove & m).sum()), "won": int((won & m).sum())}
            for split, m in (("all", drove), ("held", held), ("not_held", ~held))
        }
        print(name, result[name], file=sys.stderr)
    result["won_ratio_resume_over_restart"] = round(
        result["resume"]["all"]["won"] / max(result["restart"]["all"]["won"], 1), 3
    )
    return emit_json(result, args.out)


if __name__ == "__main__":
    main()
