"""MJX step rate of `arm-pick-place` (env steps/s, one JSON object).

For each batch size: `make_env("arm-pick-place")` (domain randomization included, joint-delta
actions, 4 physics substeps of 5 ms per 20 ms control step) under `jit(vmap(step))` inside one
`lax.scan` of `--steps` steps with fixed uniformly random actions per env; median wall time of
`--repeats` calls after the compiling call (`block_until_ready`). Env steps/s = batch · steps /
time; physics steps/s are 4× that.

Peer, in the same run: C MuJoCo stepping the same compiled scene (`mujoco.rollout`, one thread per
CPU core, `--peer-batch` envs from the MJX reset states, random controls), as env steps/s
(physics steps / 4); `ratio` is MJX over C MuJoCo at each batch size.

    python benchmarks/mjx_throughput.py --batch-sizes 64 256 --out results.json
    python benchmarks/mjx_throughput.py --batch-sizes 4096 8192 16384   # on a GPU

The issue's target: ≥ 1e6 env steps/s at 4096–16384 envs on one H200.

`--scene.impl warp` runs MuJoCo Warp's kernels instead (`pip install "hoverfly[warp]"`, a CUDA
GPU); its contact pool is sized for each batch, `overflow_envs` counts the envs whose contacts or
constraint rows did not fit (0 for a valid figure), and the JAX implementation is measured at the
same batch sizes in the same run (`peer_mjx_jax`, `ratio_vs_mjx_jax`).

    python benchmarks/mjx_throughput.py --scene.impl warp --peer-batch 0 --batch-sizes 4096 16384
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import numpy as np
import tyro

from sim import make_env
from sim.manipulator import ArmConfig, SceneConfig
from sim.manipulator._mjx import warp_overflow
from sim.wrappers import VmapWrapper


@dataclasses.dataclass(frozen=True)
class Args:
    """Batched MJX throughput of arm-pick-place."""

    batch_sizes: tuple[int, ...] = (64, 256)
    """Parallel envs."""
    steps: int = 50
    """Control steps per jitted call."""
    repeats: int = 3
    """Timed calls per batch size; the median is reported."""
    task: str = "arm-pick-place"
    """Registered arm task."""
    peer_batch: int = 256
    """Envs of the C MuJoCo peer (0: no peer)."""
    jax_peer: bool = True
    """With `--scene.impl warp`: measure MJX's JAX implementation at each batch size too."""
    scene: SceneConfig = SceneConfig()
    """Physics options of the scene (e.g. `--scene.iterations`); the peer uses the same."""
    out: Path | None = None
    """Write the JSON object here too."""


def c_mujoco_peer(task: str, scene: SceneConfig, batch: int, steps: int, repeats: int) -> dict:
    """Env steps/s of C MuJoCo (`mujoco.rollout` over all CPU cores) on the same scene."""
    import mujoco
    from mujoco import rollout as mj_rollout

    env = make_env(task, ArmConfig(scene=dataclasses.replace(scene, impl="jax")))  # reset states
    arm = env.unwrapped
    m = arm.mj_model
    state = jax.jit(jax.vmap(env.reset), compiler_options=env.compiler_options)(
        jax.random.split(jax.random.key(0), batch)
    )
    datas = [mujoco.MjData(m) for _ in range(os.cpu_count() or 1)]
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    init = np.empty((batch, mujoco.mj_stateSize(m, spec)))
    for i in range(batch):
        d = mujoco.MjData(m)
        d.qpos[:] = np.asarray(state.data.physics.qpos[i])
        d.ctrl[:] = np.asarray(state.data.physics.ctrl[i])
        mujoco.mj_getState(m, d, init[i], spec)
    nstep = steps * arm.substeps
    ctrl = np.asarray(state.data.physics.ctrl)[:, None, :] + np.random.default_rng(0).uniform(
        -0.05, 0.05, (batch, nstep, m.nu)
    )
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        mj_rollout.rollout(m, datas, init, ctrl, persistent_pool=True)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times[1:])
    return {
        "batch_size": batch,
        "threads": len(datas),
        "env_steps_per_s": round(batch * steps / median, 1),
        "physics_steps_per_s": round(batch * nstep / median, 1),
    }


def measure(task: str, scene: SceneConfig, batch: int, steps: int, repeats: int) -> dict:
    if scene.impl == "warp":  # Warp's contact pool serves this batch
        scene = dataclasses.replace(scene, warp_envs=batch)
    env = VmapWrapper(make_env(task, ArmConfig(scene=scene)))
    keys = jax.random.split(jax.random.key(0), batch)
    actions = jax.random.uniform(jax.random.key(1), (batch, env.action_size), minval=-1, maxval=1)

    def rollout(state):
        def body(s, _):
            return env.step(s, actions), None

        return jax.lax.scan(body, state, None, steps)[0]

    rollout = jax.jit(rollout, compiler_options=env.compiler_options)
    state = jax.jit(env.reset, compiler_options=env.compiler_options)(keys)
    t0 = time.perf_counter()
    state = jax.block_until_ready(rollout(state))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state = jax.block_until_ready(rollout(state))
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    extra = {}
    if scene.impl == "warp":  # envs whose contacts or constraint rows overflowed their buffers
        extra = {"overflow_envs": int(np.count_nonzero(warp_overflow(state.data.physics)))}
    return extra | {
        "batch_size": batch,
        "steps_per_call": steps,
        "compile_and_first_call_s": round(compile_s, 2),
        "median_call_s": round(median, 4),
        "env_steps_per_s": round(batch * steps / median, 1),
        "physics_steps_per_s": round(batch * steps * env.unwrapped.substeps / median, 1),
    }


def main(args: Args) -> dict:
    result = {
        "benchmark": "mjx_throughput",
        "task": args.task,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "cpu": platform.processor() or platform.machine(),
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "scene": dataclasses.asdict(args.scene),
        "results": [
            measure(args.task, args.scene, b, args.steps, args.repeats) for b in args.batch_sizes
        ],
    }
    if args.scene.impl == "warp" and args.jax_peer:
        jax_scene = dataclasses.replace(args.scene, impl="jax")
        for r in result["results"]:
            peer = measure(args.task, jax_scene, r["batch_size"], args.steps, args.repeats)
            r["peer_mjx_jax"] = peer
            r["ratio_vs_mjx_jax"] = round(r["env_steps_per_s"] / peer["env_steps_per_s"], 2)
    if args.peer_batch:
        peer = c_mujoco_peer(args.task, args.scene, args.peer_batch, args.steps, args.repeats)
        result["peer_c_mujoco"] = peer
        for r in result["results"]:
            r["ratio_vs_c_mujoco"] = round(r["env_steps_per_s"] / peer["env_steps_per_s"], 2)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
