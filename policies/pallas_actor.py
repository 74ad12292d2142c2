"""The deterministic MLP actor as one Pallas (Triton) kernel over batch-last observations.

XLA runs `jax.vmap(policy, in_axes=-1, out_axes=-1)` (`make_policy(..., deterministic=True)` on
observations `[F, B]`) as a normalizer kernel and one GEMM kernel per layer: the normalized
observation and every hidden layer `[H, B]` go through device memory and back. On an H200 at
4.2 M envs that is 2.2 ms of a 4.85 ms quadrotor rollout step (README, "Simulator throughput").
Here the whole actor is one kernel that keeps everything on chip: a Triton program reads the
weights once, then loops over blocks of `block_size` envs (a static trip count that leaves at least
`programs` programs), reading each observation block once, normalizing it, running the hidden
layers on the tensor cores and writing the actions `[A, B]`:

    z = clip((obs − mean) / max(σ, 1e-3), ±10)         (policies.normalizer.normalize)
    h₁ = act(W₁ᵀ z + b₁), …, hₙ = act(Wₙᵀ hₙ₋₁ + bₙ)  (policies.actor_critic.MLP)
    a = clip(W_outᵀ hₙ + b_out, −1, 1)                 (make_policy, deterministic)

Triton tensors have power-of-two sizes: the F observed rows are read as power-of-two chunks (50 =
32 + 16 + 2); chunks of ≥ 16 rows go through the tensor cores, smaller ones are outer products.
The observation may come in row blocks that the kernel reads where they lie (`actor(*parts)`, the
parts' rows in order make the F rows): the quadrotor's 18 measured rows from the env and its
32-row action history straight from the state (`data.actions`), so the 50-row observation is never
written and read back.
The output layer is one weighted row sum per action. Float32 matmuls run in TF32, as XLA's default
on the GPU, so actions agree with XLA's to ~1e-3, not bitwise.

    act = make_pallas_actor(params, activation="tanh")
    actions = act(obs)                                   # [F, B] -> [A, B], inside a jit
    actions = act(measured, history)                     # [18, B], [32, B] -> [A, B]

`interpret=True` runs the kernel through Pallas' interpreter (any backend: the tests, on the CPU).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from policies.actor_critic import Params

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "elu": jax.nn.elu,
    "silu": jax.nn.silu,
}
_MIN_DOT = 16  # tensor-core dots need every dimension ≥ 16


def _chunks(n: int) -> list[tuple[int, int]]:
    """(start, size) power-of-two pieces of range(n), largest first: 50 → (0,32) (32,16) (48,2)."""
    out, start = [], 0
    for bit in reversed(range(n.bit_length())):
        if n >> bit & 1:
            out.append((start, 1 << bit))
            start += 1 << bit
    return out


def _operands(params: Params) -> list[jax.Array]:
    """Kernel operands: mean and 1/σ [F, 1], per hidden layer W [in, out] and b [1, out], the
    output layer's Wᵀ [A, in] and b [A, 1]."""
    dense = params["actor"]["params"]
    layers = [dense[f"Dense_{i}"] for i in range(len(dense))]
    norm = params["obs_norm"]
    ops = [norm.mean[:, None], 1.0 / jnp.maximum(jnp.sqrt(norm.var), 1e-3)[:, None]]
    for layer in layers[:-1]:
        ops += [layer["kernel"], layer["bias"][None, :]]
    ops += [layers[-1]["kernel"].T, layers[-1]["bias"][:, None]]
    widths = [int(layer["kernel"].shape[1]) for layer in layers[:-1]]
    if not widths:
        raise ValueError("pallas actor: the actor needs at least one hidden layer")
    for w in widths:
        if w & (w - 1) or w < _MIN_DOT:
            raise ValueError(f"pallas actor: hidden widths must be powers of two ≥ 16, got {w}")
    return [jnp.asarray(x, jnp.float32) for x in ops]


def _kernel(*refs, parts: tuple[int, ...], act, clip: float, block: int, trips: int):
    """One program: `trips` blocks of `block` envs; refs: the observation's row blocks [F_i,
    trips·block] (`parts` = their F_i, in order), `_operands`, then out_ref [A, trips·block]. The
    weights are read once, before the loop over the blocks. The hidden layers are env-major,
    [block, H]: the MMA's rows are envs."""
    obs_refs, (mean_ref, inv_ref, *layer_refs, out_ref) = refs[: len(parts)], refs[len(parts) :]
    (w1_ref, b1_ref), hidden = layer_refs[:2], layer_refs[2:-2]
    wo_ref, bo_ref = layer_refs[-2:]
    # (obs ref, its rows, mean, 1/σ, W₁ rows) per piece of the observation: power-of-two chunks of
    # ≥ 16 rows for the tensor cores, single rows (outer products) for the rest
    pieces, offset = [], 0
    for obs_ref, n_rows in zip(obs_refs, parts, strict=True):
        for start, size in _chunks(n_rows):
            n = size if size >= _MIN_DOT else 1
            for r0 in range(start, start + size, n):
                r = pl.ds(offset + r0, n)
                pieces.append((obs_ref, pl.ds(r0, n), mean_ref[r, :], inv_ref[r, :], w1_ref[r, :]))
        offset += n_rows
    b1 = b1_ref[...]
    layers = [(w[...], b[...]) for w, b in zip(hidden[::2], hidden[1::2], strict=True)]
    out_rows = [(wo_ref[pl.ds(j, 1), :], bo_ref[j, 0]) for j in range(out_ref.shape[0])]

    def run_block(t, carry):
        cols = pl.ds(pl.multiple_of(t * block, block), block)
        h = b1  # [1, H1], broadcast against the first product
        for obs_ref, rows, mean, inv, w in pieces:
            z = jnp.clip((obs_ref[rows, cols] - mean) * inv, -clip, clip)  # [rows, block]
            if w.shape[0] >= _MIN_DOT:  # tensor cores: [block, rows] @ [rows, H1]
                h = h + jnp.dot(z.T, w, preferred_element_type=jnp.float32)
            else:  # outer product: [block, 1] * [1, H1]
                h = h + z.T * w
        h = act(h)
        for w, b in layers:
            h = act(jnp.dot(h, w, preferred_element_type=jnp.float32) + b)
        for j, (w, b) in enumerate(out_rows):  # output layer: one weighted row sum per action
            out_ref[j, cols] = jnp.clip(jnp.sum(h * w, axis=1) + b, -1.0, 1.0)
        return carry

    jax.lax.fori_loop(0, trips, run_block, 0)


def _trips(blocks: int, programs: int) -> int:
    """Blocks per program: the largest power of two that divides `blocks` and leaves at least
    `programs` programs (1: one block per program)."""
    trips = 1
    while programs and blocks % (2 * trips) == 0 and blocks // (2 * trips) >= programs:
        trips *= 2
    return trips


def make_pallas_actor(
    params: Params,
    activation: str = "tanh",
    block_size: int = 64,
    programs: int = 1024,
    num_warps: int = 4,
    num_stages: int = 3,
    fast_tanh: bool = False,
    interpret: bool = False,
) -> Callable[..., jax.Array]:
    """actor(obs [F, B]) -> actions [A, B] in [-1, 1]: the deterministic actor of
    `policies.make_actor_critic`'s `params` (normalizer included) in one kernel; `actor(*parts)`
    takes the observation as row blocks [F_i, B] whose rows, in order, are its F. B must be a
    multiple of `block_size` (a power of two ≥ 16, envs per MMA). Each Triton program reads the
    weights once and loops over a power-of-two number of blocks, leaving at least `programs`
    programs (0: one block per program); `num_stages`: Triton's software pipelining of that
    loop. fast_tanh: the GPU's tanh.approx.f32 (relative error ≤ 2⁻¹¹) for a tanh activation
    (not under `interpret`)."""
    if block_size & (block_size - 1) or block_size < _MIN_DOT:
        raise ValueError(f"block_size must be a power of two ≥ 16, got {block_size}")
    if programs < 0:
        raise ValueError(f"programs must be ≥ 0, got {programs}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; one of {sorted(_ACTIVATIONS)}")
    ops = _operands(params)
    n_obs, n_act = ops[0].shape[0], ops[-1].shape[0]
    act = _ACTIVATIONS[activation]
    if fast_tanh and activation == "tanh" and not interpret:
        act = pltr.approx_tanh

    def whole(x: jax.Array) -> pl.BlockSpec:
        return pl.BlockSpec(x.shape, lambda i: (0,) * x.ndim)

    def actor(*parts: jax.Array) -> jax.Array:
        rows = tuple(int(x.shape[0]) if x.ndim == 2 else -1 for x in parts)
        if not parts or min(rows) < 1 or sum(rows) != n_obs:
            shapes = ", ".join(str(tuple(x.shape)) for x in parts)
            raise ValueError(
                f"pallas actor: obs must be [{n_obs}, B] (or row blocks adding up to it), "
                f"got {shapes or 'nothing'}"
            )
        batch = parts[0].shape[1]
        if any(x.shape[1] != batch for x in parts):
            raise ValueError(
                f"pallas actor: the row blocks' batches differ: {[x.shape for x in parts]}"
            )
        if batch % block_size:
            raise ValueError(f"the batch ({batch}) must be a multiple of block_size ({block_size})")
        trips = _trips(batch // block_size, programs)
        span = trips * block_size  # envs per program
        kernel = functools.partial(
            _kernel, parts=rows, act=act, clip=10.0, block=block_size, trips=trips
        )
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((n_act, batch), jnp.float32),
            grid=(batch // span,),
            in_specs=[pl.BlockSpec((f, span), lambda i: (0, i)) for f in rows]
            + [whole(x) for x in ops],
            out_specs=pl.BlockSpec((n_act, span), lambda i: (0, i)),
            compiler_params=pltr.CompilerParams(num_warps=num_warps, num_stages=num_stages),
            interpret=interpret,
            name="pallas_actor",
        )(*(x.astype(jnp.float32) for x in parts), *ops)

    return actor
