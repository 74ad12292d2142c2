"""The fused Pallas rollout against the XLA rollout it replaces, in one run (one JSON object).

Both run `quadrotor-hover` under `wrap_for_training(ObservationSubset(env), 500, batch_axis=-1)`
with the same deterministic 64-64 tanh actor (`policies.make_actor_critic`, random weights, the
hover command as its output bias) choosing every action:
  xla    the peer: `sim_throughput.py`'s `actor_rollout_batch_last` (`make_rollout`), the best XLA
         rollout: `env.step` and the vmapped policy in a `lax.scan` of `--steps` steps.
  fused  `sim.quadrotor.fused.make_fused_rollout`: the same `--steps` steps in one Pallas kernel,
         for each `--block-sizes` × `--num-warps` (× `--fast-tanh`) variant.
Each is timed as `steps × batch` env steps per call (median of `--repeats` calls after a compiling
and a warm-up call; the state carries across calls). Parity: from one state of `--parity-batch`
envs, the fused and XLA rollouts run `--parity-steps` steps; the JSON gives the largest state
difference, the share of envs within 1e-3 of each other and the reset counts of both.

    python benchmarks/fused_rollout.py --batch-sizes 1048576 4194304 --out fused.json
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from sim_throughput import Args as ThroughputArgs
from sim_throughput import emit_json, make_rollout, report_header

from sim import ObservationSubset, make_env, wrap_for_training
from sim.quadrotor import QuadrotorConfig
from sim.quadrotor.fused import DenseActor, make_fused_rollout


@dataclasses.dataclass(frozen=True)
class Args:
    """Fused Pallas rollout vs the XLA rollout (steps/s)."""

    batch_sizes: tuple[int, ...] = (1048576, 4194304)
    """Parallel envs."""
    steps: int = 100
    """Env steps per call."""
    repeats: int = 5
    """Timed calls per measurement (median)."""
    block_sizes: tuple[int, ...] = (128,)
    """Envs per Triton program."""
    num_warps: tuple[int, ...] = (4,)
    """Warps per Triton program."""
    fast_tanh: tuple[bool, ...] = (False,)
    """Variants with the accurate tanh (False) and/or tanh.approx.f32 (True)."""
    parity_batch: int = 4096
    """Envs of the parity check (0: skip it)."""
    parity_steps: int = 20
    """Steps of the parity check."""
    seed: int = 0
    """PRNG seed."""
    out: str | None = None
    """Also write the JSON to this file."""


def _setup(batch: int, steps: int, key: jax.Array):
    """The peer, `sim_throughput.py`'s `actor_rollout_batch_last` as `peer(state, params) ->
    (state, resets)` (jitted, the state donated), its state and actor params, and the same stack
    for the fused rollout."""
    targs = ThroughputArgs(env_steps=steps)
    peer, (state, params, action) = make_rollout(targs, batch, key, "actor_rollout", -1)
    quad = make_env("quadrotor-hover", QuadrotorConfig(params=targs.params))
    env = wrap_for_training(ObservationSubset(quad), quad.unwrapped.config.episode_steps, -1)
    return env, state, params, lambda s, p: peer(s, p, action)


def _time(run, state, operand, env_steps: int, repeats: int) -> dict:
    t0 = time.perf_counter()
    state, resets = jax.block_until_ready(run(state, operand))
    first = time.perf_counter() - t0
    state, resets = jax.block_until_ready(run(state, operand))
    secs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, resets = jax.block_until_ready(run(state, operand))
        secs.append(time.perf_counter() - t0)
    rates = [env_steps / s for s in secs]
    print(f"  first call {first:.1f} s, {statistics.median(rates):.3g} steps/s", file=sys.stderr)
    return {
        "steps_per_s": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "seconds_per_call": statistics.median(secs),
        "first_call_s": first,
        "resets_per_env_step": float(jnp.sum(resets)) / env_steps,
    }


def _error(e: Exception, chars: int = 500) -> dict:
    return {"error": f"{type(e).__name__}: {str(e)[:chars]}"}


def _parity(args: Args, key: jax.Array, variant: dict) -> dict:
    env, state, params, peer = _setup(args.parity_batch, args.parity_steps, key)
    ref, ref_resets = peer(jax.tree.map(jnp.copy, state), params)
    fused = make_fused_rollout(env, args.parity_steps, **variant)
    out, resets = jax.jit(fused)(state, DenseActor.from_params(params))
    rigid_ref = np.stack([np.asarray(x) for x in jax.tree.leaves(ref.data.rigid)])
    rigid = np.stack([np.asarray(x) for x in jax.tree.leaves(out.data.rigid)])
    scale = np.array([1.0] * 13 + [float(ref.data.params.rpm_max[0])] * 4)[:, None]
    diff = np.abs(rigid - rigid_ref) / scale  # rpm as a fraction of rpm_max
    per_env = diff.max(axis=0)
    return {
        "batch": args.parity_batch,
        "steps": args.parity_steps,
        "variant": variant,
        "max_state_diff": float(per_env.max()),
        "median_env_max_diff": float(np.median(per_env)),
        "share_envs_within_1e-3": float(np.mean(per_env <= 1e-3)),
        "resets_xla": float(jnp.sum(ref_resets)),
        "resets_fused": float(jnp.sum(resets)),
        "note": "rigid state (m, m/s, rad/s, quaternion; rpm / rpm_max); TF32 matmuls and "
        "different summation orders on both sides, so chaotic episodes drift apart",
    }


def run(args: Args) -> dict:
    key = jax.random.key(args.seed)
    variants = [
        {"block_size": b, "num_warps": w, "fast_tanh": t}
        for b in args.block_sizes
        for w in args.num_warps
        for t in args.fast_tanh
    ]
    results: dict = {}
    for batch in args.batch_sizes:
        key, sub = jax.random.split(key)
        env, state, params, peer = _setup(batch, args.steps, sub)
        n = batch * args.steps
        row: dict = {}
        print(f"batch {batch}: xla", file=sys.stderr)
        try:
            row["xla"] = _time(peer, jax.tree.map(jnp.copy, state), params, n, args.repeats)
        except Exception as e:  # e.g. out of memory
            row["xla"] = _error(e, 300)
        actor = DenseActor.from_params(params)
        for v in variants:
            name = "fused_b{block_size}_w{num_warps}".format(**v) + ("_fast_tanh" * v["fast_tanh"])
            print(f"batch {batch}: {name}", file=sys.stderr)
            try:
                fused = jax.jit(make_fused_rollout(env, args.steps, **v), donate_argnums=0)
                row[name] = _time(fused, jax.tree.map(jnp.copy, state), actor, n, args.repeats)
            except Exception as e:
                row[name] = _error(e)
                print(f"  {row[name]['error']}", file=sys.stderr)
            gc.collect()
        ok = {k: r for k, r in row.items() if "steps_per_s" in r and k != "xla"}
        if ok and "steps_per_s" in row["xla"]:
            best = max(ok, key=lambda k: ok[k]["steps_per_s"])
            row["best_fused"] = best
            row["ratio_best_fused_vs_xla"] = ok[best]["steps_per_s"] / row["xla"]["steps_per_s"]
        results[str(batch)] = row
        del state
        gc.collect()
    report = {**report_header("fused_rollout", args), "results": results}
    if args.parity_batch:
        try:
            report["parity"] = _parity(args, jax.random.key(args.seed + 1), variants[0])
        except Exception as e:
            report["parity"] = _error(e)
    return report


def main(argv: Sequence[str] | None = None) -> dict:
    args = tyro.cli(Args, args=argv)
    if jax.default_backend() == "cpu":
        raise SystemExit("fused_rollout.py: the fused kernel is a Triton (GPU) kernel; no GPU here")
    return emit_json(run(args), args.out)


if __name__ == "__main__":
    main()
