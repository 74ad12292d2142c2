"""Training wrappers (episode limit, auto-reset, vmap) and domain randomization."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import sim
from sim import AutoResetWrapper, EpisodeWrapper, State, VmapWrapper, Wrapper, wrap_for_training
from sim.quadrotor import (
    DomainRandomization,
    InitConfig,
    QuadrotorEnv,
    RandomizationConfig,
    get_params,
)

B = 4  # batch of the eager vmapped tests (shared with test_brax_interop: one warm-up)


def leaves_equal(a, b) -> bool:
    def raw(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    la = jax.tree.leaves(jax.tree.map(raw, a))
    lb = jax.tree.leaves(jax.tree.map(raw, b))
    return all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


def pos(state) -> np.ndarray:
    return np.asarray(jnp.stack(state.data.rigid.pos, -1))


def _out_of_bounds(state):
    rigid = state.data.rigid.replace(pos=tuple(jnp.full_like(p, 2.5) for p in state.data.rigid.pos))
    return state.replace(data=state.data.replace(rigid=rigid))


@pytest.fixture(scope="module")
def moving_config(quiet_config):
    """No noise or disturbance, but random initial states (so fresh episodes differ)."""
    return dataclasses.replace(quiet_config, init=InitConfig(at_target_prob=0.0))


def test_episode_wrapper_truncates(quiet_config):
    env = EpisodeWrapper(QuadrotorEnv(quiet_config), episode_length=5)
    s = env.reset(jax.random.key(0))
    assert int(s.info["steps"]) == 0 and float(s.info["truncation"]) == 0
    for t in range(1, 6):
        s = env.step(s, env.default_action)
        assert int(s.info["steps"]) == t
        assert float(s.done) == float(s.info["truncation"]) == float(t == 5)


def test_episode_wrapper_termination_is_not_truncation(quiet_config):
    env = EpisodeWrapper(QuadrotorEnv(quiet_config), episode_length=1)
    s = env.step(_out_of_bounds(env.reset(jax.random.key(0))), env.default_action)
    assert float(s.done) == 1 and float(s.info["truncation"]) == 0


def _batch1(env):
    """`AutoResetWrapper` over a batch of one env, with unbatched states in and out."""
    wrapped = AutoResetWrapper(VmapWrapper(env))

    def add(s):
        return jax.tree.map(lambda x: x[None], s)

    def drop(s):
        return jax.tree.map(lambda x: x[0], s)

    return (
        lambda key: drop(wrapped.reset(key[None])),
        lambda s, a: drop(wrapped.step(add(s), a[None])),
    )


def test_auto_reset_draws_a_fresh_state(moving_config):
    inner = EpisodeWrapper(DomainRandomization(QuadrotorEnv(moving_config)), episode_length=3)
    reset, step = _batch1(inner)
    s0 = reset(jax.random.key(1))
    s0 = s0.replace(info={**s0.info, "progress": jnp.float32(0.37)})
    a = inner.default_action
    s, rewards = s0, []
    for _ in range(2):
        plain = inner.step(s, a)
        s = step(s, a)
        rewards.append(float(s.reward))
        assert float(s.done) == 0 and leaves_equal(s.data, plain.data)
        assert leaves_equal(s.obs, plain.obs)
    plain = inner.step(s, a)  # what the finishing transition looks like without auto-reset
    s = step(s, a)
    rewards.append(float(s.reward))
    # The finishing transition's reward, done and metrics are kept ...
    assert float(s.done) == 1 and float(s.info["truncation"]) == 1
    assert float(s.reward) == float(plain.reward)
    assert leaves_equal(s.metrics, plain.metrics)
    # ... the episode summary is recorded ...
    assert float(s.info["episode_done"]) == 1 and float(s.info["last_length"]) == 3
    assert float(s.info["last_return"]) == pytest.approx(sum(rewards), rel=1e-6)
    assert float(s.info["episode_return"]) == 0 and float(s.info["episode_length"]) == 0
    # ... and the state is a fresh episode, not the finished one nor a replay of the first.
    assert int(s.info["steps"]) == 0 and int(s.data.step) == 0
    assert np.abs(pos(s) - pos(plain)).min() > 1e-3
    assert np.abs(pos(s) - pos(s0)).min() > 1e-3
    assert float(s.data.params.mass) != float(s0.data.params.mass)  # re-randomized
    np.testing.assert_allclose(s.obs["state"][:3], pos(s), atol=1e-6)  # obs belongs to it
    assert float(s.info["progress"]) == pytest.approx(0.37)  # the curriculum survives
    # The next step continues the new episode.
    s = step(s, a)
    assert float(s.done) == 0 and int(s.info["steps"]) == 1
    assert float(s.info["episode_length"]) == 1 and float(s.info["last_length"]) == 3


def test_auto_reset_after_termination(moving_config):
    inner = EpisodeWrapper(QuadrotorEnv(moving_config), episode_length=100)
    reset, step = _batch1(inner)
    s = step(_out_of_bounds(reset(jax.random.key(2))), inner.default_action)
    assert float(s.done) == 1 and float(s.info["truncation"]) == 0
    assert np.abs(pos(s)).max() <= 0.5 and float(s.info["last_length"]) == 1


def test_auto_reset_needs_a_batched_env(moving_config):
    env = VmapWrapper(AutoResetWrapper(EpisodeWrapper(QuadrotorEnv(moving_config), 10)))
    s = env.reset(jax.random.split(jax.random.key(0), B))
    with pytest.raises(ValueError, match="batched env"):
        env.step(s, jnp.zeros((B, 4)))


class _DenseAutoReset(Wrapper):
    """The former auto-reset, the oracle: per env (inside the vmap), computes a fresh reset for
    every env on every step and selects it where done."""

    def reset(self, rng: jax.Array) -> State:
        state = self.env.reset(rng)
        z = jnp.zeros(())
        names = ("episode_return", "episode_length", "episode_done", "last_return", "last_length")
        return state.replace(info={**state.info, **dict.fromkeys(names, z)})

    def step(self, state: State, action: jax.Array) -> State:
        nstate = self.env.step(state, action)
        ret = state.info["episode_return"] + nstate.reward
        length = state.info["episode_length"] + 1.0
        rng, key_reset = jax.random.split(nstate.info["rng"])
        fresh = self.env.reset(key_reset)
        fresh = fresh.replace(
            info={**nstate.info, **fresh.info, "progress": nstate.info["progress"]}
        )
        done = nstate.done > 0

        def pick(a, b):
            return jnp.where(jnp.reshape(done, done.shape + (1,) * (a.ndim - done.ndim)), a, b)

        info = jax.tree.map(pick, fresh.info, nstate.info)
        info.update(
            rng=rng,
            truncation=nstate.info["truncation"],
            episode_return=jnp.where(done, 0.0, ret),
            episode_length=jnp.where(done, 0.0, length),
            episode_done=nstate.done,
            last_return=jnp.where(done, ret, state.info["last_return"]),
            last_length=jnp.where(done, length, state.info["last_length"]),
        )
        return nstate.replace(
            data=jax.tree.map(pick, fresh.data, nstate.data),
            obs=jax.tree.map(pick, fresh.obs, nstate.obs),
            info=info,
        )


def _rollout(env, key, n_envs: int, steps: int):
    """jit-able: `steps` random-action steps; returns the final state and the per-step outputs."""
    key_reset, key_act = jax.random.split(key)
    s = env.reset(jax.random.split(key_reset, n_envs))
    s = s.replace(info={**s.info, "progress": jnp.full((n_envs,), 0.3)})
    actions = jax.random.uniform(key_act, (steps, n_envs, 4), minval=-1.0, maxval=1.0)
    actions = actions.at[:, ::3].set(1.0)  # every third env climbs out of bounds (terminates)

    def body(s, a):
        s = env.step(s, a)
        return s, (s.obs, s.reward, s.done, s.info["truncation"], s.info["last_return"])

    return jax.lax.scan(body, s, actions)


@pytest.mark.parametrize(
    ("n", "k", "p"), [(10, 3, 0.5), (1000, 32, 0.01), (1000, 32, 0.9), (7, 8, 1.0), (5, 4, 0.0)]
)
def test_first_true_is_nonzero(n, k, p):
    """`sim.wrappers.first_true` returns what `jnp.nonzero(mask, size=k, fill_value=n)` does."""
    mask = jax.random.uniform(jax.random.key(n + k), (n,)) < p
    want = jnp.nonzero(mask, size=k, fill_value=n)[0]
    got = jax.jit(sim.wrappers.first_true, static_argnums=1)(mask, k)
    assert got.dtype == want.dtype and (got == want).all()


@pytest.mark.parametrize("chunk_size", [3, None])
def test_sparse_auto_reset_equals_dense(chunk_size):
    """Resetting only the finished envs (in chunks) reproduces the former reset-everything."""
    n_envs, steps = 64, 300
    inner = EpisodeWrapper(sim.make_env("quadrotor-hover"), episode_length=60)
    dense = VmapWrapper(_DenseAutoReset(inner))
    sparse = AutoResetWrapper(VmapWrapper(inner), chunk_size=chunk_size)
    key = jax.random.key(5)
    want = jax.jit(lambda k: _rollout(dense, k, n_envs, steps))(key)
    got = jax.jit(lambda k: _rollout(sparse, k, n_envs, steps))(key)
    done, trunc = np.asarray(got[1][2]) > 0, np.asarray(got[1][3]) > 0
    assert (done & ~trunc).sum() > 50 and trunc.sum() > 100  # terminations and time-outs
    assert (done.sum(1) > 3).sum() > 10 and (done.sum(1) == 0).any()  # several trips; none
    # Bitwise: dynamics state, parameters, disturbances, keys, done, every info entry.
    (gs, (gobs, grew, *gout)), (ws, (wobs, wrew, *wout)) = got, want
    assert leaves_equal(
        (gs.data.replace(actions=None), gs.info, gs.done, gout),
        (ws.data.replace(actions=None), ws.info, ws.done, wout),
    )
    # The fresh action history (hence obs, and the action reward) is the hover command
    # 2·hover_u − 1, a constant that XLA folds or computes (sqrt) differently in the two
    # programs: 1 ulp apart.
    for a, b in zip(
        jax.tree.leaves((gs.data.actions, gs.obs, gobs, grew)),
        jax.tree.leaves((ws.data.actions, ws.obs, wobs, wrew)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_auto_reset_vmaps_over_seeds():
    """Under vmap (PPO's seed sweep) the while_loop runs until every seed's envs are reset."""
    env = wrap_for_training(sim.make_env("quadrotor-hover"), episode_length=9)
    keys = jax.random.split(jax.random.key(6), 2)
    both = jax.jit(jax.vmap(lambda k: _rollout(env, k, 16, 30)))(keys)
    one = jax.jit(lambda k: _rollout(env, k, 16, 30))
    for i in range(2):
        assert leaves_equal(jax.tree.map(lambda x, i=i: x[i], both), one(keys[i]))


def test_batch_last_layout_equals_batch_first():
    """`batch_axis=-1` ([..., B] leaves, [A, B] actions) runs the same episodes, resets included,
    bit for bit."""
    n_envs, steps = 32, 200
    inner = sim.make_env("quadrotor-hover")
    first = wrap_for_training(inner, episode_length=60)
    last = wrap_for_training(inner, episode_length=60, batch_axis=-1)

    class ActionsLast(Wrapper):  # `_rollout` draws [B, A] actions
        def step(self, state, action):
            return self.env.step(state, action.T)

    key = jax.random.key(7)
    want_s, want = jax.jit(lambda k: _rollout(first, k, n_envs, steps))(key)
    got_s, got = jax.jit(lambda k: _rollout(ActionsLast(last), k, n_envs, steps))(key)
    assert float(np.sum(want[2])) > 50  # terminations and time-outs were reset
    assert got_s.obs["state"].shape == (50, n_envs) and got_s.data.actions.shape == (8, 4, n_envs)
    assert got[0]["privileged_state"].shape == (steps, 72, n_envs)
    batch_first = jax.tree.map(lambda x: jnp.moveaxis(x, -1, 0) if x.ndim > 1 else x, got_s)
    assert leaves_equal(batch_first, want_s)
    assert leaves_equal(jax.tree.map(lambda x: jnp.moveaxis(x, -1, 1), got[0]), want[0])
    assert leaves_equal(got[1:], want[1:])
    with pytest.raises(ValueError, match="batch_axis"):
        VmapWrapper(inner, batch_axis=1)


def test_observation_subset_keeps_the_named_groups(moving_config):
    """The actor's observation is unchanged; the privileged one is gone, resets included."""
    full = wrap_for_training(QuadrotorEnv(moving_config), episode_length=5)
    actor = wrap_for_training(sim.ObservationSubset(QuadrotorEnv(moving_config)), 5)
    assert actor.observation_size == {"state": full.observation_size["state"]}
    key = jax.random.key(8)
    (fs, fout), (as_, aout) = (
        jax.jit(lambda k, e=e: _rollout(e, k, B, 12))(key) for e in (full, actor)
    )
    assert set(as_.obs) == set(aout[0]) == {"state"}
    assert leaves_equal(
        (as_.data, as_.obs["state"], aout[0]["state"]), (fs.data, fs.obs["state"], fout[0]["state"])
    )


def test_observation_head_leaves_the_history_to_the_state(moving_config):
    """`head=18`: the measured rows as before, resets included; the history rows that are gone
    are the state's `data.actions`, which the Pallas actor reads instead."""
    full = wrap_for_training(sim.ObservationSubset(QuadrotorEnv(moving_config)), 5)
    head = wrap_for_training(sim.ObservationSubset(QuadrotorEnv(moving_config), head=18), 5)
    assert head.observation_size == {"state": (18,)}
    key = jax.random.key(8)
    (fs, fout), (hs, hout) = (
        jax.jit(lambda k, e=e: _rollout(e, k, B, 12))(key) for e in (full, head)
    )
    assert leaves_equal((hs.data, hout[0]["state"]), (fs.data, fout[0]["state"][..., :18]))
    history = hs.data.actions[:, : moving_config.action_history].reshape(B, -1)
    assert np.array_equal(history, fs.obs["state"][:, 18:])
    with pytest.raises(ValueError, match="head=0 must be in 1"):
        sim.ObservationSubset(QuadrotorEnv(moving_config), head=0)


def test_vmap_wrapper_equals_per_env_calls(moving_config):
    inner = EpisodeWrapper(QuadrotorEnv(moving_config), episode_length=10)
    env = VmapWrapper(inner)
    keys = jax.random.split(jax.random.key(3), B)
    actions = jax.random.uniform(jax.random.key(4), (B, 4), minval=-1.0, maxval=1.0)
    batched = env.step(env.reset(keys), actions)
    for i in range(B):
        single = inner.step(inner.reset(keys[i]), actions[i])
        row = jax.tree.map(lambda x, i=i: x[i], batched)
        for a, b in zip(
            jax.tree.leaves((single.data, single.obs, single.reward)),
            jax.tree.leaves((row.data, row.obs, row.reward)),
            strict=True,
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert batched.reward.shape == (B,) and batched.obs["state"].shape == (
        B,
        *inner.observation_size["state"],
    )
    assert env.observation_size == inner.observation_size and env.action_size == 4


def test_training_stack_resets_only_finished_envs(moving_config):
    env = wrap_for_training(QuadrotorEnv(moving_config), episode_length=100)
    s = env.reset(jax.random.split(jax.random.key(4), B))
    rigid = s.data.rigid.replace(pos=tuple(p.at[1].set(2.5) for p in s.data.rigid.pos))
    s = s.replace(data=s.data.replace(rigid=rigid))
    before = pos(s)
    s = env.step(s, jnp.zeros((B, 4)))
    kept = np.arange(B) != 1
    np.testing.assert_array_equal(np.asarray(s.done), 1.0 - kept)
    np.testing.assert_array_equal(np.asarray(s.info["steps"]), kept.astype(np.int32))
    assert np.abs(pos(s)[1]).max() <= 0.5  # fresh start
    assert np.abs(pos(s)[kept] - before[kept]).max() < 0.05  # kept flying


# -- domain randomization ----------------------------------------------------------------------
def test_randomized_parameters(hover_resets):
    p = hover_resets.data.params
    nom = get_params("cf2_l2f")
    ratio = {
        "mass": np.asarray(p.mass / nom.mass),
        **{f"inertia_{i}": np.asarray(p.inertia[i] / nom.inertia[i]) for i in range(3)},
        "thrust": np.asarray(p.thrust[2] / nom.thrust[2]),
        "torque": np.asarray(p.torque / nom.torque),
        "tau": np.asarray(p.tau_rise / nom.tau_rise),
    }
    for name, r in ratio.items():
        assert r.min() >= 0.9 - 1e-6 and r.max() <= 1.1 + 1e-6, name
        assert r.min() < 0.901 and r.max() > 1.099, name  # the full ±10 % range is used
        assert len(np.unique(r)) > 0.99 * len(r), name  # a new draw at every reset
        assert stats.kstest(r, stats.uniform(0.9, 0.2).cdf).pvalue > 1e-3, name
    np.testing.assert_allclose(np.asarray(p.tau_fall / nom.tau_fall), ratio["tau"], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(p.thrust[0]), 0.0)  # c0 = c1 = 0 stay 0 (cf2_l2f)
    np.testing.assert_array_equal(np.asarray(p.rpm_max), float(nom.rpm_max))
    np.testing.assert_array_equal(np.asarray(p.arm), float(nom.arm))
    names = list(ratio)
    corr = np.corrcoef(np.stack([ratio[n] for n in names]))
    assert np.abs(corr - np.eye(len(names))).max() < 0.05  # drawn independently


def test_randomization_off_gives_nominal_parameters(moving_config):
    for params in ("cf2_l2f", "cf21_rltools"):
        quad = QuadrotorEnv(dataclasses.replace(moving_config, params=params))
        env = DomainRandomization(quad, RandomizationConfig(0.0, 0.0, 0.0, 0.0, 0.0))
        for seed in range(3):
            s = env.reset(jax.random.key(seed))
            np.testing.assert_array_equal(
                s.data.params.as_vector(), quad.nominal_params.as_vector()
            )


def test_randomization_is_deterministic_per_key(moving_config):
    env = DomainRandomization(QuadrotorEnv(moving_config))
    a, b = env.reset(jax.random.key(9)), env.reset(jax.random.key(9))
    assert leaves_equal(a, b)
    c = env.reset(jax.random.key(10))
    assert not np.array_equal(a.data.params.as_vector(), c.data.params.as_vector())
