"""Simulator throughput of our JAX Crazyflie against the l2f peer (steps/s, one JSON object).

Ours, for each batch size (parallel envs), timed as `steps` env steps inside one jitted `lax.scan`
(median of `--repeats` calls after compile and warm-up, `block_until_ready`):
  dynamics        `sim.quadrotor.dynamics.integrate` only: RK4 at dt = 0.01 s (100 Hz, 1 substep),
                  per-env parameters (the chosen set, default the L2F paper model) and disturbance,
                  a fixed hover + N(0, 0.05) action per env; every call restarts from hover.
  env             the full RL step: `make_env("quadrotor-hover")` (domain randomization) under
                  `wrap_for_training` (vmap, auto-reset, 500-step episodes): dynamics, action
                  history (the default, 8), noisy actor and privileged critic observations,
                  reward terms, termination, a fresh random reset of the finished envs only;
                  fixed hover + noise actions.
  policy_rollout  `env` with a 64-64 tanh MLP actor (`policies.make_actor_critic`,
                  deterministic `make_policy`) choosing the actions from the observations.
  actor_rollout   `policy_rollout` with the actor's observation only
                  (`sim.ObservationSubset`: the critic's privileged observation is not computed),
                  the rollout of evaluation and validation.
  pallas_actor_rollout
                  `actor_rollout` with the batch last and the actor as one Pallas kernel
                  (`policies.pallas_actor`: the hidden layers stay on chip) that reads the 18
                  measured rows of the observation (`ObservationSubset(head=18)`) and the action
                  history from the state; GPU only.
With `--batch-axes 0 -1`, `env`, `policy_rollout` and `actor_rollout` also run with the batch on
the last axis of every leaf (`wrap_for_training(..., batch_axis=-1)`: observations [F, B], actions
[A, B]; the policy is `jax.vmap(policy, in_axes=-1, out_axes=-1)`), reported as `<name>_batch_last`.
The peer (`benchmarks/l2f_peer.py`, CPU only, optional) runs in one subprocess per OpenMP thread
count.

    python benchmarks/sim_throughput.py --out results.json
    python benchmarks/sim_throughput.py --batch-sizes 65536 1048576 --no-peer

Everything is float32 (JAX's default; l2f is compiled with float).
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import tyro

from policies import make_pallas_actor
from policies.actor_critic import NetworkConfig, make_actor_critic, make_policy
from sim import ObservationSubset, make_env, wrap_for_training
from sim.quadrotor import Disturbance, QuadrotorConfig, RigidState, get_params, integrate
from sim.quadrotor.params import GRAVITY

Benchmark = Literal["dynamics", "env", "policy_rollout", "actor_rollout", "pallas_actor_rollout"]
PEER_SCRIPT = Path(__file__).with_name("l2f_peer.py")


@dataclasses.dataclass(frozen=True)
class Args:
    """Throughput benchmark of our simulator and the l2f peer."""

    batch_sizes: tuple[int, ...] = ()
    """Parallel envs; empty: 1024 4096 16384 65536 on CPU, 2^16 .. 2^24 (every 4x) otherwise."""
    dynamics_steps: int = 0
    """Steps per jitted call of the dynamics benchmark; 0: 200 on CPU, 1000 otherwise."""
    env_steps: int = 0
    """Steps per jitted call of the env and policy_rollout benchmarks; 0: 100."""
    unroll: int = 1
    """`lax.scan` unroll of the env benchmarks' step loop (2 lets XLA write the action history
    into the loop carry on every other step instead of copying it there on every step)."""
    pallas_block_size: int = 64
    """Envs per block (one MMA's rows) of `pallas_actor_rollout`'s kernel."""
    pallas_programs: int = 1024
    """Least number of Triton programs of `pallas_actor_rollout`'s kernel, each looping over
    blocks (0: one block per program)."""
    pallas_fast_tanh: bool = True
    """`pallas_actor_rollout` with the GPU's tanh.approx.f32 in the hidden layers (relative error
    ≤ 2⁻¹¹, the rounding of the TF32 matmuls beside it)."""
    pallas_history_from_state: bool = True
    """`pallas_actor_rollout`'s kernel reads the action history from the state (`data.actions`)
    and the env writes only the 18 measured rows of the observation; off: the whole 50-row
    observation is written and read back."""
    repeats: int = 5
    """Timed calls per measurement; the median is the headline figure."""
    warmup: int = 1
    """Untimed calls after the compiling call."""
    benchmarks: tuple[Benchmark, ...] = ("dynamics", "env", "policy_rollout", "actor_rollout")
    """Which of our benchmarks to run."""
    batch_axes: tuple[Literal[0, -1], ...] = (0,)
    """Batch axis of the env benchmarks' state leaves: 0 (first, the trainers' layout), -1 (last,
    reported as `<name>_batch_last`)."""
    params: Literal["cf2_l2f", "cf21_rltools"] = "cf2_l2f"
    """Dynamics parameter set, on both sides."""
    action_noise: float = 0.05
    """σ of the fixed per-env action offset around hover (normalized units)."""
    peer: bool = True
    """Also measure l2f (skipped with a note when `import l2f` fails)."""
    peer_threads: tuple[int, ...] = ()
    """OpenMP thread counts for l2f; empty: 1, 2 and all cores."""
    peer_batch_sizes: tuple[int, ...] = (1024, 4096, 8192)
    """l2f vector sizes (powers of two up to 8192)."""
    peer_steps: int = 200
    """Steps per timed l2f loop."""
    seed: int = 0
    """PRNG seed."""
    out: str | None = None
    """Also write the JSON to this file."""


def _on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def _resolve(args: Args) -> Args:
    cpu = _on_cpu()
    batch = args.batch_sizes or (
        (1024, 4096, 16384, 65536) if cpu else tuple(2**k for k in range(16, 25, 2))
    )
    threads = args.peer_threads or tuple(sorted({1, 2, os.cpu_count() or 1}))
    return dataclasses.replace(
        args,
        batch_sizes=batch,
        peer_threads=threads,
        dynamics_steps=args.dynamics_steps or (200 if cpu else 1000),
        env_steps=args.env_steps or 100,
    )


# -- timing ---------------------------------------------------------------------------------------
def _measure(
    call: Callable[[], object], env_steps_per_call: int, repeats: int, warmup: int
) -> dict:
    """Times `call()` (which returns arrays) and converts to env steps per second."""
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        jax.block_until_ready(call())
    secs, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(call())
        secs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    rates = [env_steps_per_call / s for s in secs]
    return {
        "steps_per_s": statistics.median(rates),
        "steps_per_s_max": max(rates),
        "steps_per_s_min": min(rates),
        "seconds_per_call": statistics.median(secs),
        "cpu_ns_per_step": statistics.median(cpu) / env_steps_per_call * 1e9,
        "env_steps_per_call": env_steps_per_call,
        "first_call_s": compile_s,
    }


def _hover_actions(key: jax.Array, hover_a: jax.Array, batch: int, sigma: float) -> jax.Array:
    """[B, 4] fixed actions: hover plus a per-env Gaussian offset, clipped to [-1, 1]."""
    return jnp.clip(hover_a + sigma * jax.random.normal(key, (batch, 4)), -1.0, 1.0)


# -- our benchmarks -------------------------------------------------------------------------------
def bench_dynamics(args: Args, batch: int, key: jax.Array) -> dict:
    """RK4 dynamics only, SoA state [B] per component, per-env parameters and disturbance."""
    p = get_params(args.params)
    k_act, k_force, k_torque = jax.random.split(key, 3)
    params = jax.tree.map(lambda x: jnp.full((batch,), x), p)
    mg = p.mass * GRAVITY
    dist = Disturbance(
        force=tuple(mg / 20.0 * jax.random.normal(k_force, (3, batch))),
        torque=tuple(mg / 1e4 * jax.random.normal(k_torque, (3, batch))),
    )
    action = tuple(_hover_actions(k_act, 2.0 * p.hover_u - 1.0, batch, args.action_noise).T)
    z = jnp.zeros(batch)
    state = RigidState(
        pos=(z, z, z),
        quat=(z + 1.0, z, z, z),
        vel=(z, z, z),
        omega=(z, z, z),
        rpm=(z + p.hover_u * p.rpm_max,) * 4,
    )
    step = jax.vmap(lambda p, d, s, a: integrate(p, d, s, a, 0.01, 1))
    steps = args.dynamics_steps

    @jax.jit
    def rollout(params, dist, state, action):
        def body(s, _):
            return step(params, dist, s, action), None

        return jax.lax.scan(body, state, None, length=steps)[0]

    r = _measure(
        lambda: rollout(params, dist, state, action), batch * steps, args.repeats, args.warmup
    )
    final = rollout(params, dist, state, action)
    r["finite_fraction"] = float(jnp.mean(jnp.isfinite(final.pos[0] + final.omega[0])))
    return r


def make_rollout(args: Args, batch: int, key: jax.Array, name: str, batch_axis: int):
    """The jitted rollout of `name` ("env": the full RL step with fixed actions;
    "policy_rollout": the MLP actor in the loop; "actor_rollout": the same, actor observation
    only; "pallas_actor_rollout": that with the Pallas actor, batch last only) and its first
    arguments: `run(state, net, action) -> (state, resets)`, `env_steps` steps per call, the
    state donated."""
    pallas = name == "pallas_actor_rollout"
    if pallas and batch_axis != -1:
        raise ValueError("pallas_actor_rollout needs the batch last (--batch-axes -1)")
    quad = make_env("quadrotor-hover", QuadrotorConfig(params=args.params))
    sizes = quad.observation_size
    history = 4 * quad.unwrapped.config.action_history  # the actor observation's last rows
    split = pallas and args.pallas_history_from_state
    if name in ("actor_rollout", "pallas_actor_rollout"):
        quad = ObservationSubset(quad, head=sizes["state"][0] - history if split else None)
    env = wrap_for_training(quad, quad.unwrapped.config.episode_steps, batch_axis)
    with_policy = name != "env"
    k_reset, k_act, k_net = jax.random.split(key, 3)
    state = jax.jit(env.reset)(jax.random.split(k_reset, batch))
    action = _hover_actions(k_act, env.default_action, batch, args.action_noise)
    if batch_axis == -1:
        action = action.T
    ac = make_actor_critic(
        NetworkConfig(),
        sizes["state"][0],
        sizes["privileged_state"][0],
        env.action_size,
        action_bias=float(env.default_action[0]),
    )

    def rollout(state, net, action):
        policy = make_policy(ac, net, deterministic=True)
        if batch_axis == -1:  # obs [F, B] -> actions [A, B]
            policy = jax.vmap(policy, in_axes=(-1, None), out_axes=-1)
        if pallas:
            actor = make_pallas_actor(
                net,
                block_size=min(batch, args.pallas_block_size),
                programs=args.pallas_programs,
                fast_tanh=args.pallas_fast_tanh,
            )

        def act(s):
            if not with_policy:
                return action
            if split:  # [18, B] and the history [K, 4, B] as [4K, B]
                return actor(s.obs["state"], s.data.actions[: history // 4].reshape(history, batch))
            if pallas:
                return actor(s.obs["state"])
            return policy(s.obs["state"], k_act)[0]

        def body(carry, _):
            s, resets = carry
            a = act(s)
            s = env.step(s, a)
            # per-env counts, summed once per call: a sum over the batch on every step fused
            # into the dynamics kernel and cost 0.6 ms of a 5.7 ms step on the H200
            return (s, resets + s.done), None

        init = (state, jnp.zeros_like(state.done))
        state, resets = jax.lax.scan(body, init, None, length=args.env_steps, unroll=args.unroll)[0]
        return state, jnp.sum(resets)

    return jax.jit(rollout, donate_argnums=0), (state, ac.init(k_net), action)


def bench_env(args: Args, batch: int, key: jax.Array, name: str, batch_axis: int) -> dict:
    """`make_rollout`'s rollout timed; the state carries across calls."""
    run, (state, net, action) = make_rollout(args, batch, key, name, batch_axis)
    box = {"state": state, "resets": []}

    def call():
        box["state"], resets = run(box["state"], net, action)
        box["resets"].append(resets)
        return box["state"], resets

    r = _measure(call, batch * args.env_steps, args.repeats, args.warmup)
    r["resets_per_env_step"] = float(sum(box["resets"])) / (
        batch * args.env_steps * len(box["resets"])
    )
    feature_axis = 1 if batch_axis == 0 else 0
    r["observation_sizes"] = {k: v.shape[feature_axis] for k, v in box["state"].obs.items()}
    return r


def run_ours(args: Args) -> dict:
    key = jax.random.key(args.seed)
    out: dict = {}
    runs = [(name, 0) for name in args.benchmarks if name == "dynamics"] + [
        (name, axis) for axis in args.batch_axes for name in args.benchmarks if name != "dynamics"
    ]
    for name, axis in runs:
        if name == "pallas_actor_rollout" and (axis != -1 or _on_cpu()):
            continue  # a Triton kernel over batch-last observations
        res: dict = {}
        for batch in args.batch_sizes:
            key, sub = jax.random.split(key)
            try:
                if name == "dynamics":
                    res[str(batch)] = bench_dynamics(args, batch, sub)
                else:
                    res[str(batch)] = bench_env(args, batch, sub, name, axis)
            except Exception as e:  # e.g. out of device memory at the largest sizes
                res[str(batch)] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            gc.collect()
        includes = INCLUDES[name] + (" Batch on the last axis of every leaf." if axis else "")
        key_name = name + ("_batch_last" if axis else "")
        out[key_name] = {"includes": includes, "results": res, "best": _best(res)}
    return out


INCLUDES = {
    "dynamics": "RK4 rigid body + first-order rotor lag, dt 0.01 s, 1 substep, quaternion "
    "renormalization and rpm clamp; per-env params and disturbance; fixed actions.",
    "env": "dynamics + the default action history, noisy actor obs and privileged obs (sizes in "
    "each result's observation_sizes), reward "
    "terms, termination, episode limit 500, domain randomization and a fresh random reset of "
    "the finished envs only (resets_per_env_step says how many); fixed actions.",
    "policy_rollout": "env + deterministic 64-64 tanh MLP actor with observation "
    "normalization choosing every action.",
    "actor_rollout": "policy_rollout with the actor observation only (the critic's privileged "
    "observation is not computed).",
    "pallas_actor_rollout": "actor_rollout with the actor as one Pallas kernel (normalizer, "
    "hidden layers on chip, TF32 tensor cores).",
}
PEER_INCLUDES = {
    "dynamics": "l2f vector step: RK4 rigid body + rotor lag, dt 0.01 s, action history (16); "
    "per-env parameter structs; one Python call per step (returns a list of dts).",
    "full_step": "step + observe (82-dim: 18 state + 16-action history, Gaussian noise as ours) + "
    "reward + terminated + 500-step episode counter (numpy) + reset of finished envs "
    "only; no critic observation, no domain randomization.",
    "full_step_no_noise": "full_step with zero observation noise (l2f's default MDP; the setting "
    "of the 8.2 M steps/s reference figure).",
}


def _best(res: dict) -> dict | None:
    ok = {b: r for b, r in res.items() if "steps_per_s" in r}
    if not ok:
        return None
    b = max(ok, key=lambda b: ok[b]["steps_per_s"])
    return {"batch_size": int(b), "steps_per_s": ok[b]["steps_per_s"]}


# -- the peer -------------------------------------------------------------------------------------
def run_peer(args: Args) -> dict:
    """l2f in one subprocess per thread count (OMP_NUM_THREADS set before libgomp loads)."""
    if importlib.util.find_spec("l2f") is None:
        return {"skipped": "`import l2f` failed (not installed); pip install l2f==2.0.18"}
    p = get_params(args.params)
    model = {
        "mass": float(p.mass),
        "inertia": [float(x) for x in p.inertia],
        "thrust": [float(x) for x in p.thrust],
        "torque": float(p.torque),
        "tau_rise": float(p.tau_rise),
        "tau_fall": float(p.tau_fall),
        "arm": float(p.arm),
    }
    cfg = QuadrotorConfig(params=args.params)
    by_threads: dict = {}
    for threads in args.peer_threads:
        cmd = [
            sys.executable,
            str(PEER_SCRIPT),
            "--batch-sizes",
            *map(str, args.peer_batch_sizes),
            "--steps",
            str(args.peer_steps),
            "--repeats",
            str(args.repeats),
            "--warmup",
            str(args.warmup),
            "--model-json",
            json.dumps(model),
            "--termination-distance",
            str(cfg.termination_distance),
            "--seed",
            str(args.seed),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            by_threads[str(threads)] = {"error": proc.stderr.strip()[-500:]}
            continue
        by_threads[str(threads)] = json.loads(proc.stdout.strip().splitlines()[-1])
    ok = [r for r in by_threads.values() if "results" in r]
    if not ok:
        return {"skipped": "l2f failed in every run", "threads": by_threads}
    best: dict = {}
    for w in PEER_INCLUDES:
        cands = [
            (r["results"][w][b]["steps_per_s"], int(t), int(b))
            for t, r in by_threads.items()
            if "results" in r
            for b in r["results"].get(w, {})
        ]
        if cands:
            rate, t, b = max(cands)
            best[w] = {"steps_per_s": rate, "threads": t, "batch_size": b}
    return {
        "l2f_version": ok[0]["l2f_version"],
        "model": ok[0]["model"],
        "includes": PEER_INCLUDES,
        "threads": by_threads,
        "best": best,
    }


# l2f 2.0.18 on the 2-core CPU machine, ../shared/reference/crazyflie.md (steps/s).
REFERENCE_L2F = {
    "source": "shared/reference/crazyflie.md: PyPI l2f 2.0.18 on the project's 2-core CPU machine",
    "dynamics_1_thread": 6.5e6,
    "dynamics_2_threads": 11.6e6,
    "full_step_2_threads": 8.2e6,
}


def _reference_ratios(ours: dict) -> dict:
    pairs = {
        "dynamics_vs_ref_dynamics_2_threads": ("dynamics", "dynamics_2_threads"),
        "env_vs_ref_full_step_2_threads": ("env", "full_step_2_threads"),
        "policy_rollout_vs_ref_full_step_2_threads": ("policy_rollout", "full_step_2_threads"),
    }
    out = {}
    for name, (a, b) in pairs.items():
        ob = (ours.get(a) or {}).get("best")
        if ob:
            out[name] = ob["steps_per_s"] / REFERENCE_L2F[b]
    return out


def _ratios(ours: dict, peer: dict) -> dict:
    pairs = {
        "dynamics_vs_l2f_dynamics": ("dynamics", "dynamics"),
        "env_vs_l2f_full_step": ("env", "full_step"),
        "env_vs_l2f_full_step_no_noise": ("env", "full_step_no_noise"),
        "policy_rollout_vs_l2f_full_step": ("policy_rollout", "full_step"),
        "actor_rollout_vs_l2f_full_step": ("actor_rollout", "full_step"),
    }
    out = {}
    for name, (a, b) in pairs.items():
        ob = (ours.get(a) or {}).get("best")
        pb = (peer.get("best") or {}).get(b)
        if ob and pb:
            out[name] = ob["steps_per_s"] / pb["steps_per_s"]
    return out


def _device_name() -> str:
    d = jax.devices()[0]
    return getattr(d, "device_kind", str(d))


def main(argv: Sequence[str] | None = None) -> dict:
    """Parses `argv`, runs the benchmarks, prints (and optionally writes) the JSON; returns it."""
    args = _resolve(tyro.cli(Args, args=argv))
    load_start = os.getloadavg()
    report: dict = {
        **report_header("sim_throughput", args),
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "dtype": str(jnp.zeros(()).dtype),
        "notes": [
            "steps/s = env steps (one 10 ms control step of one quadrotor) per wall second.",
            "steps_per_s is the median over repeats; _max/_min bound it (host load adds noise).",
            "Ours runs in float32 (jax_enable_x64 off), like l2f (compiled with float).",
            "Ours on CPU uses XLA's own thread pool over all cores; the peer is given "
            "1, 2, ... OpenMP threads explicitly.",
            "Ratios divide our best batch size by the peer's best (batch size, thread count).",
        ],
    }
    report["ours"] = run_ours(args)
    report["peer"] = run_peer(args) if args.peer else {"skipped": "--no-peer"}
    report["ratios"] = _ratios(report["ours"], report["peer"])
    report["reference_l2f"] = REFERENCE_L2F
    report["ratios_vs_reference"] = _reference_ratios(report["ours"])
    report["loadavg_start_end"] = [load_start, os.getloadavg()]
    return emit_json(report, args.out)


def report_header(benchmark: str, args: object) -> dict:
    """The fields every GPU-or-CPU benchmark JSON here starts with: name, UTC time, backend,
    device, JAX version and the resolved config (`args`, a dataclass)."""
    return {
        "benchmark": benchmark,
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": jax.default_backend(),
        "device": _device_name(),
        "jax_version": jax.__version__,
        "config": dataclasses.asdict(args),
    }


def emit_json(report: dict, out: str | None) -> dict:
    """Prints `report` as JSON (and writes it to `out`); returns it as parsed back."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
    return json.loads(text)


if __name__ == "__main__":
    main()
