"""Fused rollout: many control steps of the quadrotor training stack and a dense tanh actor in one
Pallas kernel, the state held in registers.

The XLA rollout (`wrap_for_training(..., batch_axis=-1)` inside a `lax.scan`, the actor in the loop)
runs each step as a dozen kernels that write the state, the observation and the actor's hidden
layers to device memory and read them back: on an H200 it is bound by those round trips (README,
"Simulator throughput"). Here one Pallas (Triton) program owns a block of envs and runs `steps`
steps of

    observation (noise) → actor → `QuadrotorEnv.step` → episode limit → auto-reset

reading the state once and writing it once. The semantics are those of

    wrap_for_training(ObservationSubset(DomainRandomization(QuadrotorEnv(cfg))), L, batch_axis=-1)

with `jax.vmap(policy, in_axes=-1, out_axes=-1)` choosing the actions: the same state pytree in and
out, the same Threefry keys and draws (`sim.rng`), the same dynamics code (`dynamics.integrate`),
reward terms, termination, truncation, domain randomization and fresh initial states of the
finished envs. Only the actor's arithmetic differs in rounding: its first layer is a sum of
outer products, the hidden layers run on the tensor cores (TF32, as XLA's default float32 matmul on
the GPU), the last layer is one row reduction per action.

    rollout = make_fused_rollout(env, steps=100)        # env: the stack above
    state, resets = jax.jit(rollout)(state, actor)      # actor = DenseActor.from_params(...)

`use_pallas=False` runs the kernel's code through XLA instead, one jitted step per call (the
tests, on the CPU: Pallas' interpreter and XLA:CPU take minutes to compile the chained steps).
Covered: quadrotor tasks with the actor observation only; the envs per block are a power of two
that divides the batch. On a GPU the kernel compiles through `fused_compile` (the `triton`
package's pipeline without its coalesce pass, which on this kernel ran for over 8 minutes in
XLA's Triton and never finished).

Measured on an H100 it is 0.25× the XLA rollout (1.75e8 against 7.10e8 env steps/s at 4.2 M envs,
`benchmarks/fused_rollout.py`): a whole env in one thread's registers needs all 255 of them and
spills ~5 KB, which leaves 8 warps per SM. The XLA step with the actor as one Pallas kernel
(`policies.pallas_actor`) stays the fastest rollout; this one is the measured baseline for a
kernel that splits an env across threads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from sim import rng as threefry
from sim.env import Env, State
from sim.quadrotor import dynamics as dyn
from sim.quadrotor import fused_compile
from sim.quadrotor.env import QuadData, QuadrotorEnv
from sim.quadrotor.params import GRAVITY
from sim.quadrotor.randomization import DomainRandomization, RandomizationConfig
from sim.wrappers import AutoResetWrapper, EpisodeWrapper, ObservationSubset, VmapWrapper


@struct.dataclass
class DenseActor:
    """A deterministic MLP actor: a = clip(W_L·tanh(… tanh(W_1·z + b_1) …) + b_L, −1, 1) with
    z = clip((obs − mean)·inv_std, ±clip).

    obs_mean, obs_inv_std: [F]. weights: ([F, H1], [H1, H2], …, [Hn, A]). biases: ([H1], …, [A]).
    """

    obs_mean: jax.Array
    obs_inv_std: jax.Array
    weights: tuple[jax.Array, ...]
    biases: tuple[jax.Array, ...]
    clip: float = struct.field(pytree_node=False, default=10.0)

    @classmethod
    def from_params(cls, params: dict) -> DenseActor:
        """From `policies.make_actor_critic`'s params: {"actor": flax Dense_i, "obs_norm"}."""
        dense = params["actor"]["params"]
        layers = [dense[f"Dense_{i}"] for i in range(len(dense))]
        norm = params["obs_norm"]
        return cls(
            obs_mean=norm.mean,
            obs_inv_std=1.0 / jnp.maximum(jnp.sqrt(norm.var), 1e-3),
            weights=tuple(layer["kernel"] for layer in layers),
            biases=tuple(layer["bias"] for layer in layers),
        )

    def __call__(self, obs: jax.Array) -> jax.Array:
        """[..., F] → [..., A] (the reference the kernel is tested against)."""
        x = jnp.clip((obs - self.obs_mean) * self.obs_inv_std, -self.clip, self.clip)
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = x @ w + b
            if i < len(self.weights) - 1:
                x = jnp.tanh(x)
        return jnp.clip(x, -1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class _Stack:
    """What the kernel needs of the wrapped env."""

    quad: QuadrotorEnv
    randomization: RandomizationConfig | None
    episode_length: int


def _unwrap(env: Env) -> _Stack:
    """Checks `env` is wrap_for_training(ObservationSubset([DomainRandomization](QuadrotorEnv)),
    L, batch_axis=-1) and returns its parts."""
    chain, e = [], env
    while True:
        chain.append(e)
        if not hasattr(e, "env"):
            break
        e = e.env
    kinds = [type(w) for w in chain]
    expected = [AutoResetWrapper, VmapWrapper, EpisodeWrapper, ObservationSubset]
    if kinds[:4] != expected or not isinstance(chain[-1], QuadrotorEnv):
        raise ValueError(
            "make_fused_rollout needs wrap_for_training(ObservationSubset(quadrotor env), L, "
            f"batch_axis=-1); got {' > '.join(k.__name__ for k in kinds)}"
        )
    if chain[1].batch_axis != -1:
        raise ValueError("make_fused_rollout needs the batch on the last axis (batch_axis=-1)")
    if chain[3].keep != ("state",):
        raise ValueError("make_fused_rollout computes the actor observation only (keep=('state',))")
    rand = chain[4] if len(chain) == 6 else None
    if len(chain) not in (5, 6) or (rand is not None and not isinstance(rand, DomainRandomization)):
        raise ValueError(f"unsupported wrapper between ObservationSubset and the env: {kinds[4:]}")
    return _Stack(chain[-1], rand.config if rand else None, chain[2].episode_length)


# -- per-env draws on rows of keys (sim.rng's counters, one element at a time) --------------------
Key = tuple[jax.Array, jax.Array]


def _draw(key: Key, i: int) -> Key:
    """Threefry-2x32 block of counter (0, i): element i of `split`/`uniform`'s draws.

    `sim.rng.threefry2x32`'s 20 rounds, rolled: two 4-round groups per loop trip (the rotation
    sets alternate), a fifth group after it, the key schedule rotated through the carry. The
    bits are the same; the kernel holds ~60 of these. Unrolled, its 10-step form took 18 s to
    PTX and 18 s through ptxas here instead of 12 and 12, and spilled 17.8 instead of 14.1 KB.
    """
    k1, k2 = key
    rot = threefry._ROTATIONS

    def group(x1, x2, ka, kb, rotations, n):
        for r in rotations:
            x1 = x1 + x2
            x2 = threefry._rotl(x2, r) ^ x1
        return x1 + ka, x2 + kb + n

    def pair(j, c):
        x1, x2, ka, kb, kc = c
        n = (2 * j).astype(jnp.uint32)
        x1, x2 = group(x1, x2, ka, kb, rot[0], n + np.uint32(1))
        x1, x2 = group(x1, x2, kb, kc, rot[1], n + np.uint32(2))
        return x1, x2, kc, ka, kb

    kc = k1 ^ k2 ^ threefry._PARITY
    init = (k1, jnp.full_like(k1, np.uint32(i)) + k2, k2, kc, k1)
    x1, x2, ka, kb, _ = jax.lax.fori_loop(0, 2, pair, init)
    return group(x1, x2, ka, kb, rot[0], np.uint32(5))


def _uniform(key: Key, i: int, lo: float = 0.0, hi: float = 1.0) -> jax.Array:
    b1, b2 = _draw(key, i)
    return threefry.uniform_from_bits(b1 ^ b2, lo, hi)


def _normal(key: Key, i: int) -> jax.Array:
    return threefry.normal_from_uniform(_uniform(key, i, threefry.NORMAL_LOW, 1.0))


def _f32(x) -> np.float32:
    return np.float32(np.asarray(x))


# -- the env on rows ([block] arrays, one per state component) ------------------------------------
def _observe(quad: QuadrotorEnv, data, key: Key) -> list[jax.Array]:
    """`QuadrotorEnv._observe(...)["state"]` as F rows."""
    ep, ev = quad._errors(data)
    r = data.rigid
    clean = [*ep, *dyn.rotation_matrix(r.quat), *ev, *r.omega]
    n = quad.config.noise
    sigma = [n.position] * 3 + [n.orientation] * 9 + [n.velocity] * 3 + [n.angular_velocity] * 3
    noisy = [
        c + np.float32(s) * _normal(key, i)
        for i, (c, s) in enumerate(zip(clean, sigma, strict=True))
    ]
    hist = [a for k in range(quad.config.action_history) for a in data.actions[k]]
    return noisy + hist


def _fresh(stack: _Stack, key: Key, like: jax.Array):
    """`DomainRandomization.reset(key)` (or the env's own): fresh data and its noise key."""
    quad = stack.quad
    cfg = quad.config
    nominal = jax.tree.map(_f32, quad.nominal_params)
    one = jnp.ones_like(like)
    params = jax.tree.map(lambda x: x * one, nominal)
    key_env = key
    if stack.randomization is not None:
        rc = stack.randomization
        key_params, key_env = _draw(key, 0), _draw(key, 1)
        k = [_draw(key_params, i) for i in range(5)]
        tau = _uniform(k[4], 0, 1.0 - rc.motor_tau, 1.0 + rc.motor_tau) * np.float32(
            rc.motor_tau_shift
        )
        thrust = _uniform(k[2], 0, 1.0 - rc.thrust, 1.0 + rc.thrust)
        params = params.replace(
            mass=nominal.mass
            * np.float32(rc.mass_shift)
            * _uniform(k[0], 0, 1.0 - rc.mass, 1.0 + rc.mass),
            inertia=tuple(
                j * _uniform(k[1], i, 1.0 - rc.inertia, 1.0 + rc.inertia)
                for i, j in enumerate(nominal.inertia)
            ),
            thrust=tuple(c * thrust for c in nominal.thrust),
            torque=nominal.torque * _uniform(k[3], 0, 1.0 - rc.torque, 1.0 + rc.torque),
            tau_rise=nominal.tau_rise * tau,
            tau_fall=nominal.tau_fall * tau,
        )
    keys = [_draw(key_env, i) for i in range(9)]
    init = cfg.init
    scale = (_uniform(keys[0], 0) >= np.float32(init.at_target_prob)).astype(jnp.float32)
    phase = jnp.zeros_like(like)
    if cfg.task == "track":
        phase = _uniform(keys[6], 0, 0.0, cfg.track.period)
    tp, tv = quad.target(phase)
    pos = tuple(
        t + _uniform(keys[1], i, -init.position, init.position) * scale for i, t in enumerate(tp)
    )
    vel = tuple(
        t + _uniform(keys[3], i, -init.velocity, init.velocity) * scale for i, t in enumerate(tv)
    )
    w = init.angular_velocity
    rigid = dyn.RigidState(
        pos=pos,
        quat=quad.attitude_from_uniforms(tuple(_uniform(keys[2], i) for i in range(3)), scale),
        vel=vel,
        omega=tuple(_uniform(keys[4], i, -w, w) * scale for i in range(3)),
        rpm=(params.hover_u * params.rpm_max,) * 4,
    )
    mg = params.mass * np.float32(GRAVITY)
    d = [_normal(keys[5], i) for i in range(6)]
    dc = cfg.disturbance
    dist = dyn.Disturbance(
        force=tuple(d[i] * np.float32(dc.force) * mg for i in range(3)),
        torque=tuple(d[3 + i] * np.float32(dc.torque) * mg for i in range(3)),
    )
    hover_a = np.float32(2.0) * nominal.hover_u - np.float32(1.0)
    actions = tuple((hover_a * one,) * 4 for _ in range(quad._buffer))
    step = jnp.zeros_like(like, jnp.int32)
    return (rigid, params, dist, actions, step, phase), keys[8]


def _select(mask, new, old):
    return jax.tree.map(lambda n, o: jnp.where(mask, n, o), new, old)


def _step(stack: _Stack, s: dict, action: tuple):
    """One step of the wrapped env on rows; returns the new rows and the noise key of the
    observation the next action reads."""
    quad = stack.quad
    cfg = quad.config
    a = tuple(jnp.clip(x, -1.0, 1.0) for x in action)
    actions = (a, *s["actions"][:-1])
    rigid = dyn.integrate(
        s["params"], s["dist"], s["rigid"], actions[cfg.action_delay], cfg.ctrl_dt, cfg.substeps
    )
    data = QuadData(rigid, s["params"], s["dist"], actions, s["step"] + 1, s["phase"])
    rng = s["rng"]
    key_next, key_noise = _draw(rng, 0), _draw(rng, 1)
    ep, _ = quad._errors(data)
    leaves = jax.tree.leaves(rigid)
    finite = functools.reduce(jnp.logical_and, [jnp.isfinite(x) for x in leaves])
    far = functools.reduce(
        jnp.logical_or, [jnp.abs(e) > np.float32(cfg.termination_distance) for e in ep]
    )
    done = (far | ~finite).astype(jnp.float32)
    hover_a = np.float32(2.0) * data.params.hover_u - np.float32(1.0)
    action_cost = sum((x - hover_a) ** 2 for x in a)
    terms = quad.reward_terms(data, action_cost, s["progress"])
    reward = jnp.where(done > 0, np.float32(-cfg.reward.termination), sum(terms.values()))
    metrics = {f"reward/{k}": v for k, v in terms.items()}
    metrics["position_error"] = jnp.sqrt(sum(e * e for e in ep))
    # EpisodeWrapper
    steps = s["steps"] + 1
    trunc = ((steps >= stack.episode_length) & (done == 0)).astype(jnp.float32)
    done = jnp.maximum(done, trunc)
    # AutoResetWrapper: fresh states for the finished envs (skipped when none in the block)
    rng_new, key_reset = _draw(key_next, 0), _draw(key_next, 1)
    fin = done > 0
    kept = ((rigid, data.params, data.dist, actions, data.step, data.phase), key_noise)

    def reset(kept):
        fresh = _fresh(stack, key_reset, done)
        return _select(fin, fresh, kept)

    (rigid, params, dist, actions, step, phase), obs_key = jax.lax.cond(
        jnp.max(done) > 0, reset, lambda k: k, kept
    )
    ret = s["episode_return"] + reward
    length = s["episode_length"] + 1.0
    zero = jnp.zeros_like(ret)
    out = {
        "rigid": rigid,
        "params": params,
        "dist": dist,
        "actions": actions,
        "step": step,
        "phase": phase,
        "reward": reward,
        "done": done,
        "metrics": metrics,
        "rng": rng_new,
        "progress": s["progress"],
        "steps": jnp.where(fin, 0, steps),
        "truncation": trunc,
        "episode_return": jnp.where(fin, zero, ret),
        "episode_length": jnp.where(fin, zero, length),
        "episode_done": done,
        "last_return": jnp.where(fin, ret, s["last_return"]),
        "last_length": jnp.where(fin, length, s["last_length"]),
    }
    return out, obs_key


# -- the actor on rows ----------------------------------------------------------------------------
def _actor(obs: Sequence[jax.Array], refs, tanh) -> tuple[jax.Array, ...]:
    """Deterministic actions (A rows) from F observation rows; `refs` = (norm [2, F'], w1 [F', H],
    b1 [H], (w [H, H'], b [H'])…, wl [A, Hn] (transposed), bl [A])."""
    norm_ref, w1_ref, b1_ref, *hidden, wl_ref, bl_ref = refs
    h = b1_ref[...][None, :]
    for f, o in enumerate(obs):  # first layer: one outer product per observed value
        z = jnp.clip((o - norm_ref[0, f]) * norm_ref[1, f], -10.0, 10.0)
        h = h + z[:, None] * w1_ref[f, :][None, :]
    h = tanh(h)
    for w_ref, b_ref in zip(hidden[::2], hidden[1::2], strict=True):
        h = tanh(jnp.dot(h, w_ref[...], preferred_element_type=jnp.float32) + b_ref[...][None, :])
    n_act = wl_ref.shape[0]
    return tuple(
        jnp.clip(jnp.sum(h * wl_ref[j, :][None, :], axis=1) + bl_ref[j], -1.0, 1.0)
        for j in range(n_act)
    )


def _actor_operands(actor: DenseActor) -> list[jax.Array]:
    """The kernel's actor operands, padded to powers of two where Triton needs them."""
    n_obs = actor.obs_mean.shape[0]
    f_pad = pl.next_power_of_2(n_obs)
    pad = ((0, f_pad - n_obs),)
    norm = jnp.stack([jnp.pad(actor.obs_mean, pad), jnp.pad(actor.obs_inv_std, pad)])
    w1 = jnp.pad(actor.weights[0], (pad[0], (0, 0)))
    ops = [norm, w1, actor.biases[0]]
    for w, b in zip(actor.weights[1:-1], actor.biases[1:-1], strict=True):
        ops += [w, b]
    ops += [actor.weights[-1].T, actor.biases[-1]]
    for w in actor.weights[:-1]:
        if any(d & (d - 1) or d < 16 for d in w.shape[1:]):
            raise ValueError(
                f"fused actor: hidden widths must be powers of two ≥ 16, got {w.shape}"
            )
    return [x.astype(jnp.float32) for x in ops]


# -- State ⇄ rows ---------------------------------------------------------------------------------
def _rows_of(state: State) -> dict:
    d, info = state.data, state.info
    k, a = d.actions.shape[:2]
    keys = jax.random.key_data(info["rng"])  # [B, 2]
    names = ("progress", "truncation", "episode_return", "episode_length", "episode_done")
    names += ("last_return", "last_length")
    return {
        "rigid": d.rigid,
        "params": d.params,
        "dist": d.dist,
        "actions": tuple(tuple(d.actions[i, j] for j in range(a)) for i in range(k)),
        "step": d.step,
        "phase": d.phase,
        "reward": state.reward,
        "done": state.done,
        "metrics": dict(state.metrics),
        "rng": (keys[:, 0], keys[:, 1]),
        "steps": info["steps"],
        **{n: info[n] for n in names},
        "obs": tuple(state.obs["state"]),
    }


def _state_of(rows: dict, like: State) -> State:
    data = like.data.replace(
        rigid=rows["rigid"],
        params=rows["params"],
        dist=rows["dist"],
        actions=jnp.stack([jnp.stack(a) for a in rows["actions"]]),
        step=rows["step"],
        phase=rows["phase"],
    )
    key = jax.random.wrap_key_data(
        jnp.stack(rows["rng"], -1), impl=jax.random.key_impl(like.info["rng"])
    )
    skip = ("rigid", "params", "dist", "actions", "step", "phase", "reward", "done", "metrics")
    info = {**like.info, **{k: v for k, v in rows.items() if k not in (*skip, "rng", "obs")}}
    info["rng"] = key
    return like.replace(
        data=data,
        obs={"state": jnp.stack(rows["obs"])},
        reward=rows["reward"],
        done=rows["done"],
        metrics=rows["metrics"],
        info=info,
    )


_DTYPES = (jnp.float32, jnp.int32, jnp.uint32)


def _pack(rows: dict):
    """Rows → one [R_d, B] array per dtype, the treedef and each leaf's (group, row)."""
    leaves, treedef = jax.tree.flatten(rows)
    groups: list[list[jax.Array]] = [[] for _ in _DTYPES]
    where = []
    for x in leaves:
        g = [jnp.dtype(t) for t in _DTYPES].index(x.dtype)
        where.append((g, len(groups[g])))
        groups[g].append(x)
    return [jnp.stack(g) for g in groups], treedef, tuple(where)


def _run_block(stack: _Stack, steps: int, tanh, state_in, where, treedef, actor_in):
    """`steps` steps of one block: reads rows of `state_in` ([R_d, N] refs or arrays) and the
    actor operands; returns the new state leaves (rows, `where` order) and resets [N]."""
    quad = stack.quad
    s = jax.tree.unflatten(treedef, [state_in[g][r, :] for g, r in where])

    def body(_, carry):
        s, resets = carry
        s, key = _step(stack, s, _actor(s["obs"], actor_in, tanh))
        data = QuadData(s["rigid"], s["params"], s["dist"], s["actions"], s["step"], s["phase"])
        s["obs"] = tuple(_observe(quad, data, key))
        return s, resets + s["done"]

    s, resets = jax.lax.fori_loop(0, steps, body, (s, jnp.zeros_like(s["done"])))
    return jax.tree.leaves(s), resets


def make_fused_rollout(
    env: Env,
    steps: int,
    block_size: int = 128,
    num_warps: int = 4,
    fast_tanh: bool = False,
    use_pallas: bool = True,
):
    """rollout(state, actor) -> (state, resets [B]): `steps` steps of `env` with `actor`'s
    deterministic actions, in one Pallas kernel (module docstring); resets counts the episodes
    each env finished. `env` is `wrap_for_training(ObservationSubset(make_env(quadrotor task)),
    L, batch_axis=-1)`; `state` its batch-last state.

    block_size, num_warps: envs per Triton program (a power of two dividing the batch) and its
    warps. fast_tanh: the GPU's tanh.approx.f32 (relative error ≤ 2⁻¹¹) in the hidden layers.
    use_pallas=False runs the kernel's code on the whole batch through XLA instead, one jitted
    call per step (any backend, not jittable as a whole; the tests check it against the env
    stack on the CPU).
    """
    stack = _unwrap(env)
    if use_pallas and jax.default_backend() == "gpu":
        fused_compile.install()
    if steps < 1:
        raise ValueError(f"steps must be ≥ 1, got {steps}")
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    tanh = pltr.approx_tanh if fast_tanh and use_pallas else jnp.tanh
    run = functools.partial(_run_block, stack, steps, tanh)
    # Through XLA one step is one jitted call: XLA:CPU copies the reset's draws into every
    # output's fusion and takes minutes to compile two chained steps, 10 s for one.
    run_one = jax.jit(functools.partial(_run_block, stack, 1, tanh), static_argnums=(1, 2))

    def rollout(state: State, actor: DenseActor) -> tuple[State, jax.Array]:
        batch = state.done.shape[-1]
        if use_pallas and batch % block_size:
            raise ValueError(f"the batch ({batch}) must be a multiple of block_size ({block_size})")
        if actor.obs_mean.shape[0] != state.obs["state"].shape[0]:
            raise ValueError(
                f"actor reads {actor.obs_mean.shape[0]} observations, the env gives "
                f"{state.obs['state'].shape[0]}"
            )
        packed, treedef, where = _pack(_rows_of(state))
        weights = _actor_operands(actor)
        if use_pallas:
            *packed, resets = _pallas(run, packed, weights, where, treedef, block_size, num_warps)
        else:
            resets = jnp.zeros((batch,), jnp.float32)
            for _ in range(steps):
                leaves, done = run_one(packed, where, treedef, weights)
                packed = [
                    jnp.stack([x for (g, _), x in zip(where, leaves, strict=True) if g == i])
                    for i in range(len(packed))
                ]
                resets = resets + done
        leaves = [packed[g][r] for g, r in where]
        return _state_of(jax.tree.unflatten(treedef, leaves), state), resets

    return rollout


def _pallas(run, packed, weights, where, treedef, block_size, num_warps):
    """`run` over blocks of `block_size` envs, one Triton program each; the state in place."""
    n = len(packed)
    batch = packed[0].shape[-1]

    def kernel(*refs):
        state_refs, actor_refs = refs[:n], refs[n : n + len(weights)]
        out_refs, resets_ref = refs[n + len(weights) : -1], refs[-1]
        leaves, resets = run(state_refs, where, treedef, actor_refs)
        for (g, r), x in zip(where, leaves, strict=True):
            out_refs[g][r, :] = x
        resets_ref[...] = resets

    def rows(p):
        return pl.BlockSpec((p.shape[0], block_size), lambda i: (0, i))

    def whole(x):
        return pl.BlockSpec(x.shape, lambda i: (0,) * x.ndim)

    return pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct(p.shape, p.dtype) for p in packed]
        + [jax.ShapeDtypeStruct((batch,), jnp.float32)],
        grid=(batch // block_size,),
        in_specs=[rows(p) for p in packed] + [whole(w) for w in weights],
        out_specs=[rows(p) for p in packed] + [pl.BlockSpec((block_size,), lambda i: (i,))],
        input_output_aliases={i: i for i in range(n)},
        compiler_params=pltr.CompilerParams(num_warps=num_warps, num_stages=1),
        name="fused_quadrotor_rollout",
    )(*packed, *weights)
