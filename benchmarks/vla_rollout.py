"""Rollout throughput of the compact VLA in the MJX arm simulator (issue: "rollout throughput
(chunks/s) of the compact VLA with the MJX simulator on one H200, and the share of time in the
model vs the simulator").

For each preset and batch size: a randomly initialized `HoverflyVLA` (the speed does not depend on
the weights) acts in `arm-pick-place` exactly as in RL post-training (`vla.rl._rollout`: render
the front and wrist cameras of every env with MuJoCo's renderer, DLPack the proprio state to
torch, sample a chunk with the flow-noise sampler and the value head, execute K actions in one
jitted MJX scan). A first rollout compiles; the second is timed. The peer, measured in the same
run, is the simulator alone executing the same number of chunks (`vla.sft._compiled_env`, zero
actions): `ratio` = VLA-in-the-loop chunks/s ÷ simulator-only chunks/s, and `share` splits the
rollout's wall time into render / model / sim.

  python benchmarks/vla_rollout.py --device cuda --presets test small base --num-envs 64 256
  python benchmarks/vla_rollout.py --presets test --num-envs 8 --chunks 4   # CPU smoke, ~2 min

stdout: one JSON object (also written to --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["test", "small"])
    p.add_argument("--num-envs", type=int, nargs="+", default=[16])
    p.add_argument("--chunks", type=int, default=16, help="chunk boundaries timed per rollout")
    p.add_argument("--device", default="cpu", help="torch device of the model")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import torch

    from vla.collect import STATE_FIELDS, CollectConfig, collect_config_from_info
    from vla.configuration_hoverfly_vla import PRESETS
    from vla.modeling_hoverfly_vla import HoverflyVLA, num_parameters
    from vla.processor_hoverfly_vla import HoverflyVLAProcessor
    from vla.rl import _rollout
    from vla.sft import _compiled_env

    if args.device == "cpu":  # JAX's thread pool shares the cores: spinning OpenMP threads stall
        torch.set_num_threads(1)
    results = []
    for preset in args.presets:
        config = PRESETS[preset].replace(proprio_dim=len(_state_dims()), action_dim=4)
        model = HoverflyVLA(config, torch.Generator().manual_seed(0)).to(args.device).eval()
        processor = HoverflyVLAProcessor(config)
        size = (config.image_size, config.image_size)
        env_info = {
            "collect": dataclasses.asdict(CollectConfig(image_size=size)),
            "state_fields": list(STATE_FIELDS),
        }
        k = config.n_action_steps
        steps = args.chunks * k
        for n in args.num_envs:
            _rollout(model, processor, env_info, n, 1, 0, k, 0.0)  # compile, warm up
            start = time.perf_counter()
            ro = _rollout(model, processor, env_info, n, 1, 1, steps, 0.0)
            wall = time.perf_counter() - start
            chunks = n * ro.logp.shape[1]
            # peer: the simulator alone, the same chunks
            env, reset, execute = _compiled_env(collect_config_from_info(env_info), k, ())
            state = reset(jax.random.split(jax.random.key(2), n))
            dead, zeros = jnp.zeros(n), jnp.zeros((k, n, env.action_size))
            jax.block_until_ready(execute(state, dead, zeros))
            t0 = time.perf_counter()
            for _ in range(ro.logp.shape[1]):
                state, dead, out = execute(state, dead, zeros)
                jax.block_until_ready(out)
            sim_wall = time.perf_counter() - t0
            row = {
                "preset": preset,
                "parameters": num_parameters(config),
                "image_size": config.image_size,
                "cameras": list(config.cameras),
                "chunk": [config.chunk_size, k],
                "num_envs": n,
                "chunks": chunks,
                "chunks_per_s": chunks / wall,
                "env_steps_per_s": chunks * k / wall,
                "share": {part: sec / wall for part, sec in ro.seconds.items()},
                "peer_sim_only_chunks_per_s": chunks / sim_wall,
                "ratio": (chunks / wall) / (chunks / sim_wall),
            }
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    report = {
        "benchmark": "vla_rollout",
        "device": args.device,
        "torch_device_name": _device_name(args.device),
        "jax_backend": jax.default_backend(),
        "platform": platform.platform(),
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return report


def _state_dims() -> list[int]:
    from vla.collect import state_index

    return list(state_index())


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or "cpu"


if __name__ == "__main__":
    main()
