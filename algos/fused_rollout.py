"""The quadrotor rollout with the actor in the loop as one Pallas (Triton) kernel over many steps.

`make_fused_rollout(env, params, steps)` runs `steps` steps of the batch-last training env
`wrap_for_training(ObservationSubset(make_env("quadrotor-hover"), head=18), L, batch_axis=-1)`
with the deterministic actor of `params` choosing every action, as XLA runs
`env.step(state, make_pallas_actor(params)(obs, history))` in a `lax.scan`, but in one kernel: a
Triton program takes a block of envs, reads its state once, keeps it in registers over all the
steps and writes it once. Per step and env: the actor (normalizer, hidden layers on the tensor
cores, as `policies.pallas_actor`), the action history (a renaming of registers, no copy), RK4
(`sim.quadrotor.dynamics.integrate`), the observation noise, reward, termination, truncation,
the episode statistics and, for a block with a finished env, the domain-randomized reset of
`sim.wrappers.AutoResetWrapper`. XLA's step writes and reads the whole state through device
memory on every step (README, "Simulator throughput").

The random draws are those of the XLA env: Threefry-2x32 (`sim.rng`) of the same keys and
counters, so states, keys and dones agree with the XLA rollout (`tests/algos/test_fused_rollout.py`
compares them under Pallas' interpreter on the CPU; on the GPU the tensor cores' TF32 matmuls
and the transcendental functions differ from XLA's in the last bits, so chaotic trajectories
drift apart over many steps, as for `policies.pallas_actor`).

    rollout = make_fused_rollout(env, params, steps=100)
    state, resets = jax.jit(rollout, donate_argnums=0)(state)   # resets: done count over the steps

Hover and track tasks, any action history and delay, with or without domain randomization; the
state must come from that env chain (checked, one error naming what differs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from policies.actor_critic import Params
from policies.pallas_actor import actor_operands, actor_tail, kernel_activation
from sim import ObservationSubset
from sim import rng as threefry
from sim.env import Env, State
from sim.quadrotor import dynamics as dyn
from sim.quadrotor.env import OBS_SIZE, QuadData, QuadrotorEnv
from sim.quadrotor.params import GRAVITY, QuadParams
from sim.quadrotor.randomization import DomainRandomization, RandomizationConfig
from sim.wrappers import AutoResetWrapper, EpisodeWrapper, VmapWrapper

_MIN_DOT = 16  # tensor-core dots need every dimension ≥ 16


def _chain(env: Env) -> tuple[QuadrotorEnv, RandomizationConfig | None, int]:
    """(quadrotor env, randomization or None, episode length) of the env chain the kernel runs."""
    want = (
        "wrap_for_training(ObservationSubset(make_env('quadrotor-*'), head=18), L, batch_axis=-1)"
    )
    chain = []
    e = env
    while True:
        chain.append(e)
        if not hasattr(e, "env"):
            break
        e = e.env
    ok = (
        len(chain) in (5, 6)
        and isinstance(chain[0], AutoResetWrapper)
        and isinstance(chain[1], VmapWrapper)
        and chain[1].batch_axis == -1
        and isinstance(chain[2], EpisodeWrapper)
        and isinstance(chain[3], ObservationSubset)
        and chain[3].keep == ("state",)
        and chain[3].head == OBS_SIZE
        and isinstance(chain[-1], QuadrotorEnv)
        and (len(chain) == 5 or isinstance(chain[4], DomainRandomization))
    )
    if not ok:
        got = " ∘ ".join(type(e).__name__ for e in chain)
        raise ValueError(f"fused rollout: needs the env {want}, got {got}")
    randomization = chain[4].config if len(chain) == 6 else None
    return chain[-1], randomization, chain[2].episode_length


# -- the state as rows ------------------------------------------------------------------------


def _key_rows(key: jax.Array) -> jax.Array:
    """[2, B] uint32 words of batch-last keys (typed [B] or raw [2, B])."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) != "threefry2x32":
            raise ValueError(f"fused rollout: needs Threefry keys, got {jax.random.key_impl(key)}")
        return jax.random.key_data(key).T
    return key


def _pack(state: State) -> tuple[dict[str, jax.Array], dict[str, tuple[str, int, int]]]:
    """The state's leaves as rows [R, B] grouped by kind ("f": float32, "i": int32, "k": the
    key words) and where each leaf lies: keystr → (group, first row, rows)."""
    groups: dict[str, list[jax.Array]] = {"f": [], "i": [], "k": []}
    where = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = jax.tree_util.keystr(path)
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) or leaf.dtype == jnp.uint32:
            g, rows = "k", _key_rows(leaf)
        elif leaf.dtype == jnp.int32:
            g, rows = "i", leaf.reshape(-1, leaf.shape[-1])
        else:
            g, rows = "f", leaf.astype(jnp.float32).reshape(-1, leaf.shape[-1])
        where[name] = (g, sum(int(x.shape[0]) for x in groups[g]), int(rows.shape[0]))
        groups[g].append(rows)
    out = {}
    for g, x in groups.items():
        x = jnp.concatenate(x)
        pad = _pow2(x.shape[0]) - x.shape[0]  # one [2ᵏ, block] tile per group in the kernel
        out[g] = jnp.concatenate([x, jnp.zeros((pad, x.shape[1]), x.dtype)]) if pad else x
    return out, where


def _unpack(state: State, rows: dict[str, jax.Array], where) -> State:
    def leaf(path, old):
        g, start, n = where[jax.tree_util.keystr(path)]
        x = rows[g][start : start + n]
        if g == "k":
            if jnp.issubdtype(old.dtype, jax.dtypes.prng_key):
                return jax.random.wrap_key_data(x.T, impl=jax.random.key_impl(old))
            return x
        return x.reshape(old.shape).astype(old.dtype)

    return jax.tree_util.tree_map_with_path(leaf, state)


# -- the observation's join into tensor-core operands -------------------------------------------


def _join(xs: list, xp=jnp):
    """[n] vectors [block] (n a power of two) → [block, n] by pairwise stacks on the last axis
    (all Triton has); the columns come out in a shuffled order that `_join_order` gives."""
    xs = [xp.stack([a, b], axis=-1) for a, b in zip(xs[::2], xs[1::2], strict=True)]
    while len(xs) > 1:
        xs = [xp.stack([a, b], axis=-1) for a, b in zip(xs[::2], xs[1::2], strict=True)]
        xs = [x.reshape(*x.shape[:-2], -1) for x in xs]
    return xs[0]


@functools.cache
def _join_order(n: int) -> tuple[int, ...]:
    """Which of `_join`'s n inputs each column of its output is."""
    return tuple(int(i) for i in _join([np.array([i]) for i in range(n)], np)[0])


def _pow2(n: int) -> int:
    """The least power of two ≥ max(n, 2)."""
    return 1 << max(n - 1, 1).bit_length()


def _split(x: jax.Array) -> list:
    """A tile [n, block] as its n rows [block] (a power-of-two split: all Triton has)."""
    return [r.reshape(r.shape[1]) for r in jnp.split(x, x.shape[0], axis=0)]


def _columns(rows: list) -> jax.Array:
    """n rows [block] (n a power of two) as the columns of a tile [block, n], in order."""
    where = np.argsort(_join_order(len(rows)))
    return _join([rows[i] for i in where])


# -- in-kernel random draws (sim.rng's bits, per env) ----------------------------------------


def _hash(key, counter):
    """Both Threefry-2x32 words of `counter` (uint32) under the per-env key (k1, k2): `sim.rng`'s
    hash with its five 4-round groups in a loop."""
    k1, k2 = key
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    even, odd = threefry._ROTATIONS

    def group(i, carry):
        x1, x2, ka, kb, kc = carry  # ka, kb, kc: ks[(i + 1) % 3], ks[(i + 2) % 3], ks[i % 3]
        for j in range(4):
            r = jnp.where((i & 1) == 0, np.uint32(even[j]), np.uint32(odd[j]))
            x1 = x1 + x2
            x2 = ((x2 << r) | (x2 >> (np.uint32(32) - r))) ^ x1
        return x1 + ka, x2 + kb + (i + 1).astype(jnp.uint32), kb, kc, ka

    init = (ks[0], ks[1] + counter, ks[1], ks[2], ks[0])
    return jax.lax.fori_loop(0, 5, group, init)[:2]


def _counted(fn, n: int, zero) -> list:
    """[fn(0), …, fn(n − 1)] (uint32 counters) with `fn` traced once: a loop whose carry shifts
    each new value in. Each hash written out once per draw made a kernel of ~80 hashes per step
    that Triton took many minutes to compile (its layout passes grow faster than the code)."""
    if n == 1:
        return [fn(np.uint32(0))]

    def body(i, carry):
        return (*carry[1:], fn(i.astype(jnp.uint32)))

    return list(jax.lax.fori_loop(0, n, body, (zero,) * n))


def _keys(key, n: int) -> list:
    """`split(key, n)` of per-env keys."""
    z = jnp.zeros_like(key[0])
    return _counted(lambda i: _hash(key, i), n, (z, z))


def _draws(key, n: int, convert) -> list:
    """`convert(jax.random.bits(key, (n,)))` as n per-env rows."""
    z = jnp.zeros(key[0].shape, jnp.float32)
    return _counted(lambda i: convert(jnp.bitwise_xor(*_hash(key, i))), n, z)


def _uniform(lo=0.0, hi=1.0):
    return functools.partial(threefry.uniform_from_bits, minval=lo, maxval=hi)


# -- the env, per block of envs --------------------------------------------------------------


class _Step:
    """The env chain's step and reset on per-env rows (lists of [block] vectors)."""

    def __init__(self, quad: QuadrotorEnv, randomization, episode_length: int):
        self.quad, self.cfg = quad, quad.config
        # Python floats: a kernel may not capture arrays
        self.nominal = jax.tree.map(float, quad.nominal_params)
        self.hover_a = 2.0 * float(quad.nominal_params.hover_u) - 1.0
        self.randomization, self.episode_length = randomization, episode_length
        n = self.cfg.noise
        self.sigma = [n.position] * 3 + [n.orientation] * 9 + [n.velocity] * 3
        self.sigma += [n.angular_velocity] * 3

    def measured(self, data: QuadData, noise: list) -> list:
        """The actor observation's 18 measured rows (`QuadrotorEnv._observe`)."""
        ep, ev = self.quad._errors(data)
        r = data.rigid
        clean = [*ep, *dyn.rotation_matrix(r.quat), *ev, *r.omega]
        return [c + s * z for c, s, z in zip(clean, self.sigma, noise, strict=True)]

    def step(self, c: dict, action: list) -> dict:
        """One step of AutoReset(Vmap(Episode(ObservationSubset(env)))) for the rows in `c`."""
        cfg = self.cfg
        data: QuadData = c["data"]
        action = [jnp.clip(a, -1.0, 1.0) for a in action]
        actions = [tuple(action), *data.actions[:-1]]  # newest first: a renaming
        rigid = dyn.integrate(
            data.params,
            data.dist,
            data.rigid,
            actions[cfg.action_delay],
            cfg.ctrl_dt,
            cfg.substeps,
        )
        data = data.replace(rigid=rigid, actions=tuple(actions), step=data.step + 1)
        k_next, k_noise = _keys(c["rng"], 2)
        noise = _draws(k_noise, OBS_SIZE, threefry.normal_from_bits)
        obs = self.measured(data, noise)
        tp, _ = self.quad.target(self.quad._time(data))
        err = [p - t for p, t in zip(rigid.pos, tp, strict=True)]
        far = functools.reduce(jnp.maximum, [jnp.abs(e) for e in err]) > cfg.termination_distance
        finite = functools.reduce(
            jnp.logical_and, [jnp.isfinite(x) for x in jax.tree.leaves(rigid)]
        )
        done = (far | ~finite).astype(jnp.float32)
        hover_a = 2.0 * data.params.hover_u - 1.0
        cost = sum((a - hover_a) ** 2 for a in action)
        terms = self.quad.reward_terms(data, cost, c["progress"])
        reward = jnp.where(done > 0, -cfg.reward.termination, sum(terms.values()))
        metrics = {f"reward/{k}": v for k, v in terms.items()}
        metrics["position_error"] = jnp.sqrt(sum(e * e for e in err))
        # EpisodeWrapper
        steps = c["steps"] + 1
        trunc = ((steps >= self.episode_length) & (done == 0)).astype(jnp.float32)
        done = jnp.maximum(done, trunc)
        # AutoResetWrapper: the reset key is the second key of split(k_next)
        ret, length = c["episode_return"] + reward, c["episode_length"] + 1.0
        finished = done > 0
        out = {
            **c,
            "data": data,
            "obs": obs,
            "steps": steps,
            "rng": _hash(k_next, np.uint32(0)),
            "reward": reward,
            "done": done,
            "metrics": metrics,
            "truncation": trunc,
            "episode_return": jnp.where(finished, 0.0, ret),
            "episode_length": jnp.where(finished, 0.0, length),
            "episode_done": done,
            "last_return": jnp.where(finished, ret, c["last_return"]),
            "last_length": jnp.where(finished, length, c["last_length"]),
            "resets": c["resets"] + done,
        }

        def reset(o):
            data, obs = self.reset(_hash(k_next, np.uint32(1)))

            def pick(new, old):
                return jnp.where(finished, new, old)

            return {
                **o,
                "data": jax.tree.map(pick, data, o["data"]),
                "obs": [pick(n, x) for n, x in zip(obs, o["obs"], strict=True)],
                "steps": jnp.where(finished, 0, o["steps"]),
            }

        return jax.lax.cond(jnp.max(done) > 0, reset, lambda o: o, out)

    def reset(self, key) -> tuple[QuadData, list]:
        """`DomainRandomization.reset` (or `QuadrotorEnv.reset`) of per-env keys: the data and the
        measured observation."""
        params = jax.tree.map(lambda x: jnp.full(key[0].shape, x, jnp.float32), self.nominal)
        if self.randomization is not None:
            key_params, key = _keys(key, 2)
            params = self.randomized(key_params, params)
        return self.initial(key, params)

    def randomized(self, key, p: QuadParams) -> QuadParams:
        """`sim.quadrotor.randomization.randomize_params`."""
        cfg = self.randomization
        k = _keys(key, 5)

        def s(i, r, n=1):
            return _draws(k[i], n, _uniform(1.0 - r, 1.0 + r))

        ji = s(1, cfg.inertia, 3)
        thrust = s(2, cfg.thrust)[0]
        tau = s(4, cfg.motor_tau)[0] * cfg.motor_tau_shift
        return p.replace(
            mass=p.mass * cfg.mass_shift * s(0, cfg.mass)[0],
            inertia=tuple(j * ji[i] for i, j in enumerate(p.inertia)),
            thrust=tuple(x * thrust for x in p.thrust),
            torque=p.torque * s(3, cfg.torque)[0],
            tau_rise=p.tau_rise * tau,
            tau_fall=p.tau_fall * tau,
        )

    def initial(self, key, params: QuadParams) -> tuple[QuadData, list]:
        """`QuadrotorEnv.reset_with_params`."""
        quad, init = self.quad, self.cfg.init
        keys = _keys(key, 9)
        scale = (_draws(keys[0], 1, _uniform())[0] >= init.at_target_prob).astype(jnp.float32)

        def u(i, half):
            return tuple(x * scale for x in _draws(keys[i], 3, _uniform(-half, half)))

        zero = jnp.zeros_like(scale)
        phase = zero
        if self.cfg.task == "track":
            phase = _draws(keys[6], 1, _uniform(0.0, self.cfg.track.period))[0]
        tp, tv = quad.target(phase)
        off = u(1, init.position)
        dv = u(3, init.velocity)
        angles = _draws(keys[2], 3, _uniform())
        rigid = dyn.RigidState(
            pos=tuple(p + o for p, o in zip(tp, off, strict=True)),
            quat=quad.attitude_from_uniforms(tuple(angles), scale),
            vel=tuple(v + d for v, d in zip(tv, dv, strict=True)),
            omega=u(4, init.angular_velocity),
            rpm=(params.hover_u * params.rpm_max,) * 4,
        )
        mg = params.mass * GRAVITY
        d = _draws(keys[5], 6, threefry.normal_from_bits)
        dist = dyn.Disturbance(
            force=tuple(x * self.cfg.disturbance.force * mg for x in d[:3]),
            torque=tuple(x * self.cfg.disturbance.torque * mg for x in d[3:]),
        )
        hover_a = zero + self.hover_a
        data = QuadData(
            rigid=rigid,
            params=params,
            dist=dist,
            actions=((hover_a,) * 4,) * quad._buffer,
            step=jnp.zeros_like(scale, jnp.int32),
            phase=phase,
        )
        noise = _draws(keys[8], OBS_SIZE, threefry.normal_from_bits)
        return data, self.measured(data, noise)


# -- the kernel -------------------------------------------------------------------------------


def _kernel(*refs, where, env: _Step, steps: int, unroll: int, act, history: int):
    """One program: a block of envs for `steps` steps. refs: the state's row tiles "f", "i", "k"
    [2ᵏ, block] (`_pack`), the actor's operands (`_actor_operands`), then the outputs "f", "i",
    "k" and the per-env done count [1, block]. Each tile is read and written once: every row a
    memory access of its own made Triton's coalescing pass take minutes (it walks the whole
    kernel from every access)."""
    f_ref, i_ref, k_ref, mean_ref, inv_ref, w1_ref, b1_ref, *layer_refs = refs[:-4]
    hidden, (wo_ref, bo_ref) = layer_refs[:-2], layer_refs[-2:]
    fo_ref, io_ref, ko_ref, resets_ref = refs[-4:]
    ins = {"f": _split(f_ref[...]), "i": _split(i_ref[...]), "k": _split(k_ref[...])}

    def rows(name):
        g, start, n = where[name]
        return ins[g][start : start + n]

    def one(name):
        return rows(name)[0]

    def tup(name, n):
        return tuple(one(f"{name}[{i}]") for i in range(n))

    p = ".data.params"
    params = QuadParams(
        mass=one(f"{p}.mass"),
        inertia=tup(f"{p}.inertia", 3),
        thrust=tup(f"{p}.thrust", 3),
        torque=one(f"{p}.torque"),
        tau_rise=one(f"{p}.tau_rise"),
        tau_fall=one(f"{p}.tau_fall"),
        rpm_max=one(f"{p}.rpm_max"),
        arm=one(f"{p}.arm"),
    )
    r = ".data.rigid"
    actions = rows(".data.actions")
    data = QuadData(
        rigid=dyn.RigidState(
            pos=tup(f"{r}.pos", 3),
            quat=tup(f"{r}.quat", 4),
            vel=tup(f"{r}.vel", 3),
            omega=tup(f"{r}.omega", 3),
            rpm=tup(f"{r}.rpm", 4),
        ),
        params=params,
        dist=dyn.Disturbance(force=tup(".data.dist.force", 3), torque=tup(".data.dist.torque", 3)),
        actions=tuple(tuple(actions[4 * k : 4 * k + 4]) for k in range(len(actions) // 4)),
        step=one(".data.step"),
        phase=one(".data.phase"),
    )
    info = ["progress", "truncation", "episode_return", "episode_length", "episode_done"]
    info += ["last_return", "last_length", "steps"]
    metrics = [n[len(".metrics['") : -2] for n in where if n.startswith(".metrics[")]
    carry = {
        "data": data,
        "obs": rows(".obs['state']"),
        "rng": tuple(rows(".info['rng']")),
        "reward": one(".reward"),
        "done": one(".done"),
        "metrics": {m: one(f".metrics['{m}']") for m in metrics},
        **{k: one(f".info['{k}']") for k in info},
        "resets": jnp.zeros_like(one(".reward")),
    }

    # the actor's weights, read once; its input as one tile [block, 2ᵏ] (`_actor_operands`)
    mean, inv, w1, b1 = mean_ref[...], inv_ref[...], w1_ref[...], b1_ref[...]
    layers = [(w[...], b[...]) for w, b in zip(hidden[::2], hidden[1::2], strict=True)]
    out_rows = [(wo_ref[pl.ds(j, 1), :], bo_ref[j, 0]) for j in range(wo_ref.shape[0])]
    n_in = int(w1.shape[0])

    def actor(obs, hist):
        x = obs + [a for entry in hist[: history // 4] for a in entry]
        x += [jnp.zeros_like(x[0])] * (n_in - len(x))
        z = jnp.clip((_columns(x) - mean) * inv, -10.0, 10.0)
        h = jnp.dot(z, w1, preferred_element_type=jnp.float32) + b1  # tensor cores
        return actor_tail(h, layers, out_rows, act)

    def body(_, c):
        return env.step(c, actor(c["obs"], c["data"].actions))

    carry = jax.lax.fori_loop(0, steps, body, carry, unroll=unroll)

    d = carry["data"]
    values = {
        ".data.actions": [a for entry in d.actions for a in entry],
        ".obs['state']": carry["obs"],
        ".info['rng']": list(carry["rng"]),
        ".reward": [carry["reward"]],
        ".done": [carry["done"]],
        **{f".metrics['{m}']": [v] for m, v in carry["metrics"].items()},
        **{f".info['{k}']": [carry[k]] for k in info},
    }
    for path, leaf in jax.tree_util.tree_flatten_with_path(d.replace(actions=()))[0]:
        values[".data" + jax.tree_util.keystr(path)] = [leaf]
    for g, ref in (("f", fo_ref), ("i", io_ref), ("k", ko_ref)):
        out = [jnp.zeros_like(ins[g][0])] * ref.shape[0]
        for name, (group, start, n) in where.items():
            if group == g:
                out[start : start + n] = [v.astype(ref.dtype) for v in values[name]]
        ref[...] = _columns(out).T
    resets_ref[...] = carry["resets"][None, :]


def _actor_operands(params: Params, n_obs: int) -> list[jax.Array]:
    """`actor_operands` with the input layer as one tensor-core dot: the n_obs inputs padded to a
    power of two (zero weights): mean and 1/σ [1, 2ᵏ], W₁ [2ᵏ, H₁], b₁ [1, H₁], the rest as they
    are."""
    mean, inv, w1, b1, *rest = actor_operands(params)
    pad = _pow2(max(n_obs, _MIN_DOT)) - n_obs
    mean = jnp.concatenate([mean[:, 0], jnp.zeros(pad)])[None, :]
    inv = jnp.concatenate([inv[:, 0], jnp.ones(pad)])[None, :]
    w1 = jnp.concatenate([w1, jnp.zeros((pad, w1.shape[1]))])
    return [mean, inv, w1, b1, *rest]


def make_fused_rollout(
    env: Env,
    params: Params,
    steps: int,
    activation: str = "tanh",
    block_size: int = 64,
    num_warps: int = 4,
    unroll: int = 1,
    fast_tanh: bool = False,
    interpret: bool = False,
) -> Callable[[State], tuple[State, jax.Array]]:
    """rollout(state) -> (state after `steps` steps, number of finished episodes): the batch-last
    quadrotor training env (module docstring) with the deterministic actor of `params`
    (`policies.make_actor_critic`'s, normalizer included) in one kernel. B must be a multiple of
    `block_size` (envs per program and per tensor-core dot: a power of two ≥ 16). fast_tanh: the
    GPU's tanh.approx.f32 in the hidden layers (not under `interpret`)."""
    if block_size & (block_size - 1) or block_size < _MIN_DOT:
        raise ValueError(f"block_size must be a power of two ≥ 16, got {block_size}")
    if steps < 1 or unroll < 1:
        raise ValueError(f"steps and unroll must be ≥ 1, got {steps} and {unroll}")
    quad, randomization, length = _chain(env)
    history = 4 * quad.config.action_history
    n_obs = int(actor_operands(params)[0].shape[0])
    if n_obs != OBS_SIZE + history:
        raise ValueError(
            f"fused rollout: the actor reads {n_obs} observations, the env gives "
            f"{OBS_SIZE} + {history} (action history)"
        )
    ops = [x.astype(jnp.float32) for x in _actor_operands(params, n_obs)]
    act = kernel_activation(activation, fast_tanh and not interpret)
    step = _Step(quad, randomization, length)

    def whole(x: jax.Array) -> pl.BlockSpec:
        return pl.BlockSpec(x.shape, lambda i: (0,) * x.ndim)

    def rollout(state: State) -> tuple[State, jax.Array]:
        rows, where = _pack(state)
        batch = int(rows["f"].shape[1])
        if batch % block_size:
            raise ValueError(f"the batch ({batch}) must be a multiple of block_size ({block_size})")
        groups = ("f", "i", "k")
        kernel = functools.partial(
            _kernel, where=where, env=step, steps=steps, unroll=unroll, act=act, history=history
        )

        def tile(x):
            return pl.BlockSpec((x.shape[0], block_size), lambda i: (0, i))

        *out, resets = pl.pallas_call(
            kernel,
            out_shape=[jax.ShapeDtypeStruct(rows[g].shape, rows[g].dtype) for g in groups]
            + [jax.ShapeDtypeStruct((1, batch), jnp.float32)],
            grid=(batch // block_size,),
            in_specs=[tile(rows[g]) for g in groups] + [whole(x) for x in ops],
            out_specs=[tile(rows[g]) for g in groups]
            + [pl.BlockSpec((1, block_size), lambda i: (0, i))],
            input_output_aliases={0: 0, 1: 1, 2: 2},
            compiler_params=pltr.CompilerParams(num_warps=num_warps, num_stages=1),
            interpret=interpret,
            name="fused_quadrotor_rollout",
        )(*(rows[g] for g in groups), *ops)
        return _unpack(state, dict(zip(groups, out, strict=True)), where), jnp.sum(resets)

    return rollout


__all__ = ["make_fused_rollout"]
