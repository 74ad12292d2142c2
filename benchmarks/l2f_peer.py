"""Throughput of the peer simulator: PyPI `l2f` ("Learning to Fly in Seconds", Eschmann et al.,
RA-L 2024), stepping many Crazyflies on the CPU through its `vectorN` API (C++, OpenMP over envs).

Runs in its own process, so that OMP_NUM_THREADS takes effect before libgomp starts and JAX's thread
pool stays out of the way; `sim_throughput.py` launches it once per thread count. Needs no JAX:

    OMP_NUM_THREADS=2 python benchmarks/l2f_peer.py --batch-sizes 1024 8192 --steps 200

Prints one JSON object: steps/s per workload and batch size (median of `--repeats` timed loops).

Workloads (each timed loop = `steps` Python calls per workload step, all envs stepped per call):
  dynamics            `vector.step` only: l2f's RK4 step (rigid body + rotor lag) at dt = 0.01 s
                      with its action-history update; a fixed hover + noise action per env.
  full_step           `step`, `observe` (82-dim observation, Gaussian noise as in the L2F paper),
                      `reward`, `terminated`, a 500-step episode counter (numpy) and
                      `sample_initial_state_if_truncated` (resets only the finished envs).
  full_step_no_noise  the same with zero observation noise (l2f's default MDP, which skips the
                      Gaussian draws; the setting of the reference figure in crazyflie.md).

The model is set explicitly through l2f's JSON parameters (by default the L2F paper Crazyflie, the
same numbers as `sim.quadrotor.params.cf2_l2f`), and so are the reward weights: PyPI l2f 2.0.18's
defaults are shifted by a struct mismatch (../shared/reference/crazyflie.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

GRAVITY = 9.81

# The L2F paper model (sim.quadrotor.params.cf2_l2f); thrust T = c0 + c1·u + c2·u², u = rpm/rpm_max.
CF2_L2F = {
    "mass": 0.027,
    "inertia": [3.85e-6, 3.85e-6, 5.9675e-6],
    "thrust": [0.0, 0.0, 3.16e-10 * 21702.0**2],
    "torque": 0.005964552,
    "tau_rise": 0.15,
    "tau_fall": 0.15,
    "arm": 0.028,
}

# Our env's defaults (sim.quadrotor.env): L2F reward weights, observation noise σ, termination.
REWARD = {
    "scale": 0.5,
    "constant": 2.0,
    "termination_penalty": 0.0,
    "position": 5.0,
    "position_clip": 1e9,
    "orientation": 5.0,
    "linear_velocity": 0.01,
    "angular_velocity": 0.0,
    "linear_acceleration": 0.0,
    "angular_acceleration": 0.0,
    "action": 0.01,
    "d_action": 0.0,
    "position_error_integral": 0.0,
}
NOISE = {
    "position": 0.001,
    "orientation": 0.001,
    "linear_velocity": 0.002,
    "angular_velocity": 0.002,
}
WORKLOADS = ("dynamics", "full_step", "full_step_no_noise")


def hover_u(model: dict) -> float:
    """Normalized motor command whose four thrusts balance gravity."""
    c0, c1, c2 = model["thrust"]
    t = model["mass"] * GRAVITY / 4.0
    return (-c1 + (c1 * c1 - 4.0 * c2 * (c0 - t)) ** 0.5) / (2.0 * c2)


def make_parameters(l2f, device, model: dict, noise: bool, termination_distance: float):
    """An `l2f.Parameters` with `model`, the L2F reward weights, and our noise and termination."""
    env = l2f.Environment()
    l2f.initialize_environment(device, env)
    params = l2f.Parameters()
    l2f.initial_parameters(device, env, params)
    js = json.loads(l2f.parameters_to_json(device, env, params))
    dyn = js["dynamics"]
    arm = model["arm"]
    dyn["rotor_positions"] = [
        [arm, -arm, 0.0],
        [-arm, -arm, 0.0],
        [-arm, arm, 0.0],
        [arm, arm, 0.0],
    ]
    dyn["rotor_torque_directions"] = [[0.0, 0.0, s] for s in (-1.0, 1.0, -1.0, 1.0)]
    dyn["rotor_thrust_coefficients"] = [list(model["thrust"])] * 4
    dyn["rotor_torque_constants"] = [model["torque"]] * 4
    dyn["rotor_time_constants_rising"] = [model["tau_rise"]] * 4
    dyn["rotor_time_constants_falling"] = [model["tau_fall"]] * 4
    dyn["mass"] = model["mass"]
    j = model["inertia"]
    dyn["J"] = [[j[0], 0.0, 0.0], [0.0, j[1], 0.0], [0.0, 0.0, j[2]]]
    dyn["J_inv"] = [[1 / j[0], 0.0, 0.0], [0.0, 1 / j[1], 0.0], [0.0, 0.0, 1 / j[2]]]
    dyn["hovering_throttle_relative"] = hover_u(model)
    mdp = js["mdp"]
    mdp["reward"].update(REWARD)
    mdp["observation_noise"].update(NOISE if noise else dict.fromkeys(NOISE, 0.0))
    mdp["termination"].update(
        position_threshold=termination_distance,
        linear_velocity_threshold=1e9,
        angular_velocity_threshold=1e9,
    )
    l2f.parameters_from_json(device, env, json.dumps(js), params)
    back = json.loads(l2f.parameters_to_json(device, env, params))
    if abs(back["dynamics"]["mass"] - model["mass"]) > 1e-6:
        raise RuntimeError("l2f did not take the model parameters")
    return params


class _Vector:
    """`n` l2f environments with shared parameters, double-buffered states and work arrays."""

    def __init__(
        self, l2f, device, n: int, params, hover_a: float, seed: int, action_noise: float = 0.05
    ):
        if n not in l2f.vector_selector:
            raise ValueError(f"l2f has no vector{n}; choose from {sorted(l2f.vector_selector)}")
        v = self.v = l2f.vector_selector[n]
        self.device, self.n = device, n
        self.env = v.VectorEnvironment()
        v.initialize_environment(device, self.env)
        self.params = v.VectorParameters()
        v.initial_parameters(device, self.env, self.params)
        self.params.parameters = [params] * n
        self.rng = v.VectorRng()
        v.initialize_rng(device, self.rng, seed)
        self.state, self.next_state = v.VectorState(), v.VectorState()
        v.sample_initial_state(device, self.env, self.params, self.state, self.rng)
        noise = np.random.default_rng(seed).normal(0.0, action_noise, (n, 4))
        self.action = np.ascontiguousarray(np.clip(hover_a + noise, -1, 1), np.float32)
        self.obs = np.zeros((n, self.env.OBSERVATION_DIM), np.float32)
        self.reward = np.zeros(n, np.float32)
        self.terminated = np.zeros(n, bool)
        self.steps = np.zeros(n, np.int64)
        self.resets = 0

    def step_dynamics(self) -> None:
        v, d = self.v, self.device
        v.step(d, self.env, self.params, self.state, self.action, self.next_state, self.rng)
        self.state, self.next_state = self.next_state, self.state

    def step_full(self, episode_steps: int = 500) -> None:
        v, d, e, p, rng = self.v, self.device, self.env, self.params, self.rng
        s, s2 = self.state, self.next_state
        v.step(d, e, p, s, self.action, s2, rng)
        v.observe(d, e, p, s2, self.obs, rng)
        v.reward(d, e, p, s, self.action, s2, self.reward, rng)
        v.terminated(d, e, p, s2, self.terminated, rng)
        self.steps += 1
        done = self.terminated | (self.steps >= episode_steps)
        self.steps[done] = 0
        self.resets += int(done.sum())
        v.sample_initial_state_if_truncated(d, e, p, s2, done, rng)
        self.state, self.next_state = s2, s


def _time_loop(fn, steps: int, n: int, repeats: int, warmup: int) -> dict:
    for _ in range(warmup):
        for _ in range(steps):
            fn()
    rates, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            fn()
        rates.append(n * steps / (time.perf_counter() - t0))
        cpu.append(time.process_time() - c0)
    return {
        "steps_per_s": statistics.median(rates),
        "steps_per_s_max": max(rates),
        "steps_per_s_min": min(rates),
        "cpu_ns_per_step": statistics.median(cpu) / (n * steps) * 1e9,
        "steps_per_call": 1,
        "timed_steps": steps,
    }


def run_peer(
    batch_sizes: Sequence[int] = (1024, 4096, 8192),
    steps: int = 200,
    repeats: int = 5,
    warmup: int = 1,
    model: dict | None = None,
    termination_distance: float = 2.0,
    workloads: Sequence[str] = WORKLOADS,
    seed: int = 0,
) -> dict:
    """Measures l2f in this process (thread count: OMP_NUM_THREADS); returns a JSON-able dict."""
    import l2f  # optional dependency, imported here so that --help works without it

    model = model or CF2_L2F
    device = l2f.Device()
    results: dict = {w: {} for w in workloads}
    for n in batch_sizes:
        for w in workloads:
            params = make_parameters(
                l2f,
                device,
                model,
                noise=(w == "full_step"),
                termination_distance=termination_distance,
            )
            vec = _Vector(l2f, device, n, params, 2.0 * hover_u(model) - 1.0, seed)
            fn = vec.step_dynamics if w == "dynamics" else vec.step_full
            r = _time_loop(fn, steps, n, repeats, warmup)
            if w != "dynamics":
                r["resets_per_env_step"] = vec.resets / (n * steps * (repeats + warmup))
            results[w][str(n)] = r
    return {
        "l2f_version": _version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "model": model,
        "results": results,
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("l2f")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[1024, 4096, 8192],
        help="environments per vector (l2f offers powers of two up to 8192)",
    )
    ap.add_argument("--steps", type=int, default=200, help="steps per timed loop")
    ap.add_argument("--repeats", type=int, default=5, help="timed loops; the median is reported")
    ap.add_argument("--warmup", type=int, default=1, help="untimed loops first")
    ap.add_argument("--model-json", default=None, help="model dict (keys of CF2_L2F) as JSON")
    ap.add_argument("--termination-distance", type=float, default=2.0, help="m, per axis")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    out = run_peer(
        a.batch_sizes,
        a.steps,
        a.repeats,
        a.warmup,
        json.loads(a.model_json) if a.model_json else None,
        a.termination_distance,
        a.workloads,
        a.seed,
    )
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return out


if __name__ == "__main__":
    main()
