"""The Pallas actor kernel against XLA's actor on batch-last observations (one JSON object).

Both compute the deterministic 64-64 tanh actor of `policies.make_actor_critic` (random weights,
a random normalizer, the output layer scaled ×100 so that part of the actions clip) on one
`[50, B]` observation array (the quadrotor's actor observation):
  xla     the peer: `jax.vmap(make_policy(ac, params, deterministic=True), in_axes=-1,
          out_axes=-1)`, as `sim_throughput.py`'s batch-last rollouts run it.
  pallas  `policies.make_pallas_actor(params)` for each `--block-sizes` × `--programs` ×
          `--num-stages` × `--num-warps` × `--fast-tanh` × `--splits` variant (`--programs 0`:
          one block of envs per Triton program; N: each program loops over blocks, ≥ N
          programs; `--splits 18`: the observation as two arrays, its first 18 rows and the
          rest, as `sim_throughput.py`'s `pallas_actor_rollout` passes the measured rows and
          the action history; 0: one array).
Each is timed as the mean of `--calls` jitted calls after a compiling and a warm-up call. Parity:
the largest action difference from the XLA actor and from the XLA actor at full float32
precision (`jax.default_matmul_precision("highest")`), and the share of clipped actions.

    python benchmarks/pallas_actor.py --batch-sizes 4194304 --out pallas_actor.json
    python benchmarks/pallas_actor.py --batch-sizes 256 --interpret   # CPU: Pallas' interpreter
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import tyro
from sim_throughput import emit_json, report_header

from policies import (
    NetworkConfig,
    NormalizerState,
    make_actor_critic,
    make_pallas_actor,
    make_policy,
)

OBS, ACT = 50, 4


@dataclasses.dataclass(frozen=True)
class Args:
    """Pallas actor kernel against XLA's actor."""

    batch_sizes: tuple[int, ...] = (1048576, 4194304, 16777216)
    """Observations per call."""
    block_sizes: tuple[int, ...] = (64, 128)
    """Envs per block (one MMA's rows)."""
    programs: tuple[int, ...] = (0, 1024)
    """Least number of Triton programs, each looping over blocks (0: one block per program)."""
    num_stages: tuple[int, ...] = (1, 3)
    """Triton pipeline stages of a program's loop over blocks."""
    num_warps: tuple[int, ...] = (4,)
    """Warps per Triton program."""
    fast_tanh: tuple[bool, ...] = (True,)
    """tanh.approx.f32 in the hidden layers, or libdevice's tanh."""
    splits: tuple[int, ...] = (0,)
    """Row at which the observation is cut into two arrays (0: one array)."""
    calls: int = 20
    """Timed calls per variant."""
    interpret: bool = False
    """Run the kernel in Pallas' interpreter (CPU; a smoke test, not a timing)."""
    seed: int = 0
    """PRNG seed."""
    out: str | None = None
    """Also write the JSON to this file."""


def _time(
    fn: Callable[..., jax.Array], obs: Sequence[jax.Array], calls: int
) -> tuple[float, float]:
    """(first call s, mean ms per call after a warm-up call) of `fn(*obs)`."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*obs))
    first = time.perf_counter() - t0
    jax.block_until_ready(fn(*obs))
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn(*obs)
    jax.block_until_ready(out)
    return first, (time.perf_counter() - t0) / calls * 1e3


def run(args: Args, batch: int) -> dict:
    key_net, key_mean, key_var, key_obs = jax.random.split(jax.random.key(args.seed), 4)
    ac = make_actor_critic(NetworkConfig(), OBS, 72, ACT, action_bias=-0.2)
    params = ac.init(key_net)
    params["obs_norm"] = NormalizerState(
        0.3 * jax.random.normal(key_mean, (OBS,)),
        jnp.exp(jax.random.normal(key_var, (OBS,))),
        jnp.ones(()),
    )
    out_layer = params["actor"]["params"]["Dense_2"]
    out_layer["kernel"] = 100.0 * out_layer["kernel"]
    obs = 2.0 * jax.random.normal(key_obs, (OBS, batch))
    policy = make_policy(ac, params, deterministic=True)
    xla = jax.jit(lambda o: jax.vmap(policy, in_axes=(-1, None), out_axes=-1)(o, key_obs)[0])
    first, ms = _time(xla, (obs,), args.calls)
    ref = xla(obs)
    with jax.default_matmul_precision("highest"):
        exact = jax.jit(lambda o: jax.vmap(policy, in_axes=(-1, None), out_axes=-1)(o, key_obs)[0])(
            obs
        )
    res: dict = {
        "xla": {"ms_per_call": ms, "first_call_s": first, "steps_per_s": batch / ms * 1e3},
        "xla_max_abs_diff_vs_float32": float(jnp.max(jnp.abs(ref - exact))),
        "clipped_share": float(jnp.mean(jnp.abs(exact) == 1.0)),
        "pallas": {},
    }
    variants = itertools.product(
        args.block_sizes,
        args.programs,
        args.num_stages,
        args.num_warps,
        args.fast_tanh,
        args.splits,
    )
    for block, programs, stages, warps, fast, split in variants:
        name = f"block{block}_programs{programs}_stages{stages}_warps{warps}" + (
            "_fast_tanh" if fast else ""
        )
        parts = (obs,)
        if split:
            name += f"_split{split}"
            parts = tuple(jnp.split(obs, [split]))
        kernel = make_pallas_actor(
            params, block_size=block, programs=programs, num_warps=warps, num_stages=stages,
            fast_tanh=fast, interpret=args.interpret,
        )  # fmt: skip
        try:
            fn = jax.jit(kernel)
            first, ms = _time(fn, parts, args.calls)
            out = fn(*parts)
        except Exception as e:  # e.g. a variant Triton cannot compile
            res["pallas"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        res["pallas"][name] = {
            "ms_per_call": ms,
            "first_call_s": first,
            "steps_per_s": batch / ms * 1e3,
            "max_abs_diff_vs_xla": float(jnp.max(jnp.abs(out - ref))),
            "max_abs_diff_vs_float32": float(jnp.max(jnp.abs(out - exact))),
            "speedup_vs_xla": res["xla"]["ms_per_call"] / ms,
        }
    ok = {k: v for k, v in res["pallas"].items() if "ms_per_call" in v}
    res["best"] = min(ok, key=lambda k: ok[k]["ms_per_call"]) if ok else None
    return res


def main(argv: Sequence[str] | None = None) -> dict:
    args = tyro.cli(Args, args=argv)
    report = report_header("pallas_actor", args)
    report["results"] = {str(b): run(args, b) for b in args.batch_sizes}
    return emit_json(report, args.out)


if __name__ == "__main__":
    main()
