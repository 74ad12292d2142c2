"""The README main job over seeds, through the command: wall clocks cold and warm, stops, evals.

Runs `hoverfly train TASK --seed N --out RUNS/TASK_N` for N = 0 … seeds − 1 in order with one
fresh compilation cache (the first run is cold, the rest warm), then the seeds in `--cold` again,
each with its own fresh cache; every run starts from an empty folder. Prints (and with `--out`
writes) one JSON object: per run the training wall clock (`metrics.csv`'s last `wall_time_s`, as
`run.log` counts it), the time to the first update, the stop and its validations, the eval, the
command's wall clock; the seeds ≥ 95 %, the warm median, and the cold mean as a ratio to the peer
figure, the L2F paper's TD3 recipe (26.8 s on this 2-core CPU, ../shared/reference/crazyflie.md;
RLtools is not packaged, so it is quoted, not re-run).

  python benchmarks/cli_seeds.py --seeds 10 --cold 1 2 --out hover_cli_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from algos.run_folder import EVAL, VALIDATION, read_metrics

L2F_TD3_SECONDS = 26.8


def run(task: str, seed: int, run_dir: Path, cache: str, extra: list[str]) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = ["hoverfly", "train", task, "--seed", str(seed), "--out", str(run_dir), *extra]
    t = time.perf_counter()
    proc = subprocess.run(
        cmd, env={**os.environ, "HOVERFLY_CACHE_DIR": cache}, capture_output=True, text=True
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    log = (run_dir / "run.log").read_text()
    first = re.search(r"time to first update ([\d.]+) s .*compilation cache (\w+)", log)
    rows, validations = read_metrics(run_dir), read_metrics(run_dir, VALIDATION)
    ev = json.loads((run_dir / EVAL).read_text())
    return {
        "seed": seed,
        "compilation_cache": first.group(2),
        "time_to_first_update_s": float(first.group(1)),
        "stopped_at_update": int(rows[-1]["update"]),
        "env_steps": int(rows[-1]["env_steps"]),
        "training_wall_s": float(rows[-1]["wall_time_s"]),
        "command_wall_s": round(wall, 2),
        "validations": [[int(v["update"]), float(v["success_rate"])] for v in validations],
        "eval": {k: ev[k] for k in ("success_rate", "pos_rmse_m", "termination_rate", "episodes")},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="quadrotor-hover")
    p.add_argument("--seeds", type=int, default=10, help="seeds 0 … N − 1, one cache")
    p.add_argument("--cold", type=int, nargs="*", default=[1, 2], help="seeds rerun cold")
    p.add_argument("--runs", default="runs", help="folder for the run folders")
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--out", default=None)
    args, extra = p.parse_known_args()  # the rest goes to `hoverfly train` (e.g. --preset gpu)
    runs_dir = Path(args.runs)
    cache = tempfile.mkdtemp(prefix="hoverfly_cache_")
    runs = [
        run(args.task, s, runs_dir / f"{args.task}_{s}", cache, extra) for s in range(args.seeds)
    ]
    for s in args.cold:
        fresh = tempfile.mkdtemp(prefix="hoverfly_cache_")
        runs.append(run(args.task, s, runs_dir / f"{args.task}_{s}_cold", fresh, extra))
    for r in runs:
        print(json.dumps(r), flush=True)
    warm = [r["training_wall_s"] for r in runs if r["compilation_cache"] == "warm"]
    cold = [r["training_wall_s"] for r in runs if r["compilation_cache"] == "cold"]
    success = [r["eval"]["success_rate"] for r in runs[: args.seeds]]
    out = {
        "benchmark": "cli_seeds",
        "command": f"hoverfly train {args.task} --seed N --out RUN {' '.join(extra)}".strip(),
        "seeds": args.seeds,
        "seeds_ge_threshold": sum(x >= args.threshold for x in success),
        "threshold": args.threshold,
        "mean_success": round(statistics.mean(success), 4),
        "warm_training_wall_s_median": statistics.median(warm) if warm else None,
        "warm_training_wall_s_range": [min(warm), max(warm)] if warm else None,
        "cold_training_wall_s": cold,
        "peer": {"name": "L2F TD3 recipe (RLtools), reference figure", "seconds": L2F_TD3_SECONDS},
        "ratio_peer_over_ours_cold_mean": round(L2F_TD3_SECONDS / statistics.mean(cold), 3),
        "runs": runs,
    }
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))


if __name__ == "__main__":
    main()
