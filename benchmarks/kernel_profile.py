"""Where a quadrotor rollout step spends its device time: kernels by XLA fusion name (one JSON).

Builds the `sim_throughput.py` rollouts (`env`, `policy_rollout`, `actor_rollout`, each with the
batch first or last), runs `--steps` steps in one jitted `lax.scan` after two warm-up calls, traces
one call with `jax.profiler` (a Perfetto trace) and sums the device events by name: per-step
milliseconds and launches, largest first. Meant for a GPU; on the CPU the trace holds no device
kernels and only the wall clock is reported.

    python benchmarks/kernel_profile.py --batch-size 4194304 --out kernels.json
    python benchmarks/kernel_profile.py --rollouts actor_rollout --batch-axes -1 --top 12
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import tempfile
import time
from pathlib import Path
from typing import Literal

import jax
import tyro
from sim_throughput import Args as ThroughputArgs
from sim_throughput import emit_json, make_rollout, report_header

Rollout = Literal["env", "policy_rollout", "actor_rollout", "pallas_actor_rollout"]


@dataclasses.dataclass(frozen=True)
class Args:
    """Per-kernel device time of the quadrotor rollouts."""

    batch_size: int = 4194304
    """Parallel envs."""
    steps: int = 10
    """Env steps per traced call."""
    unroll: int = 1
    """`lax.scan` unroll of the step loop (`sim_throughput.py --unroll`)."""
    pallas_block_size: int = 64
    """Envs per block (one MMA's rows) of `pallas_actor_rollout`'s kernel."""
    pallas_programs: int = 1024
    """Least number of Triton programs of `pallas_actor_rollout`'s kernel, each looping over
    blocks (0: one block per program)."""
    pallas_fast_tanh: bool = True
    """`pallas_actor_rollout` with tanh.approx.f32 (`sim_throughput.py --pallas-fast-tanh`)."""
    pallas_history_from_state: bool = True
    """`pallas_actor_rollout` reads the action history from the state
    (`sim_throughput.py --pallas-history-from-state`)."""
    rollouts: tuple[Rollout, ...] = ("env", "policy_rollout", "actor_rollout")
    """Which rollouts to profile."""
    batch_axes: tuple[Literal[0, -1], ...] = (0, -1)
    """Batch axis of the state leaves (0 first, -1 last)."""
    top: int = 20
    """Kernels listed per rollout (the rest are summed into `other_ms_per_step`)."""
    seed: int = 0
    """PRNG seed."""
    out: str | None = None
    """Also write the JSON to this file."""


def _device_events(trace_dir: Path) -> list[dict]:
    """Complete events ("X") of the trace's device processes (names containing "GPU")."""
    files = sorted(trace_dir.rglob("perfetto_trace.json.gz"))
    if not files:
        return []
    trace = json.loads(gzip.open(files[-1]).read())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    return [e for e in events if e.get("ph") == "X" and "GPU" in procs.get(e.get("pid"), "")]


def profile(args: Args, name: str, batch_axis: int) -> dict:
    run, (state, net, action) = make_rollout(
        ThroughputArgs(
            env_steps=args.steps,
            unroll=args.unroll,
            pallas_block_size=args.pallas_block_size,
            pallas_programs=args.pallas_programs,
            pallas_fast_tanh=args.pallas_fast_tanh,
            pallas_history_from_state=args.pallas_history_from_state,
        ),
        args.batch_size,
        jax.random.key(args.seed),
        name,
        batch_axis,
    )
    for _ in range(2):  # compile, warm up
        state = jax.block_until_ready(run(state, net, action)[0])
    t0 = time.perf_counter()
    state = jax.block_until_ready(run(state, net, action)[0])
    wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            state = jax.block_until_ready(run(state, net, action)[0])
        events = _device_events(Path(tmp))
    ms, calls = collections.Counter(), collections.Counter()
    for e in events:
        ms[e["name"]] += e.get("dur", 0.0) / 1e3 / args.steps  # µs per call -> ms per step
        calls[e["name"]] += 1 / args.steps
    kernels = [
        {"name": k, "ms_per_step": round(v, 4), "launches_per_step": round(calls[k], 2)}
        for k, v in ms.most_common(args.top)
    ]
    listed = sum(k["ms_per_step"] for k in kernels)
    return {
        "wall_ms_per_step": wall * 1e3 / args.steps,
        "steps_per_s": args.batch_size * args.steps / wall,
        "device_ms_per_step": sum(ms.values()),
        "kernels": kernels,
        "other_ms_per_step": sum(ms.values()) - listed,
    }


def main(argv: list[str] | None = None) -> dict:
    args = tyro.cli(Args, args=argv)
    report = {**report_header("kernel_profile", args), "results": {}}
    for axis in args.batch_axes:
        for name in args.rollouts:
            if name == "pallas_actor_rollout" and axis != -1:
                continue  # batch-last only
            key = name + ("_batch_last" if axis == -1 else "")
            report["results"][key] = profile(args, name, axis)
    return emit_json(report, args.out)


if __name__ == "__main__":
    main()
