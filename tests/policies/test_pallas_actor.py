"""The Pallas actor kernel against `make_policy` (its interpreter on the CPU; the GPU figures are
in the README), and its Triton lowering."""

import jax
import jax.numpy as jnp
import pytest

from policies import (
    NetworkConfig,
    NormalizerState,
    make_actor_critic,
    make_pallas_actor,
    make_policy,
)
from policies.pallas_actor import _chunks, _trips

F, A = 50, 4


def _params(cfg: NetworkConfig | None = None, obs: int = F):
    cfg = cfg or NetworkConfig()
    ac = make_actor_critic(cfg, obs, 72, A, action_bias=-0.2)
    params = ac.init(jax.random.key(0))
    k_mean, k_var = jax.random.split(jax.random.key(1))
    params["obs_norm"] = NormalizerState(
        0.3 * jax.random.normal(k_mean, (obs,)),
        jnp.exp(jax.random.normal(k_var, (obs,))).at[0].set(0.0),  # σ floored at 1e-3
        jnp.ones(()),
    )
    out = params["actor"]["params"][f"Dense_{len(cfg.actor_hidden)}"]
    out["kernel"] = 100.0 * out["kernel"]  # large enough that the output clip acts
    return ac, params


def _reference(ac, params, obs):
    policy = make_policy(ac, params, deterministic=True)
    return jax.vmap(policy, in_axes=(-1, None), out_axes=-1)(obs, jax.random.key(0))[0]


def test_chunks_are_power_of_two_pieces():
    assert _chunks(50) == [(0, 32), (32, 16), (48, 2)]
    assert _chunks(64) == [(0, 64)]
    assert _chunks(7) == [(0, 4), (4, 2), (6, 1)]


def test_trips_leave_at_least_the_programs_asked_for():
    assert _trips(65536, 1024) == 64  # 4.2 M envs in blocks of 64
    assert _trips(48, 4) == 8  # 6 programs of 8 blocks
    assert _trips(48, 0) == _trips(48, 100) == 1  # one block per program
    assert _trips(7, 1) == 1  # odd: no power of two divides it


@pytest.mark.parametrize(
    ("hidden", "activation", "obs", "programs"),
    [((64, 64), "tanh", F, 1), ((32,), "relu", 18, 0), ((16, 32, 16), "elu", 100, 2)],
)
def test_pallas_actor_equals_make_policy(hidden, activation, obs, programs):
    cfg = NetworkConfig(actor_hidden=hidden, activation=activation)
    ac, params = _params(cfg, obs)
    x = 3.0 * jax.random.normal(jax.random.key(2), (obs, 256))
    x = x.at[0].set(x[0] * 1e4)  # normalized far beyond the ±10 clip
    ref = _reference(ac, params, x)
    actor = make_pallas_actor(params, activation, block_size=64, programs=programs, interpret=True)
    out = jax.jit(actor)(x)  # programs 1: one program loops over 4 blocks; 2: 2 programs of 2
    assert out.shape == (A, 256)
    assert jnp.mean(jnp.abs(ref) == 1.0) > 0.05  # the clip is exercised
    assert jnp.max(jnp.abs(out - ref)) < 1e-5


def test_pallas_actor_reads_the_observation_in_row_blocks():
    ac, params = _params()
    x = 3.0 * jax.random.normal(jax.random.key(3), (F, 128))
    ref = _reference(ac, params, x)
    actor = make_pallas_actor(params, block_size=64, programs=1, interpret=True)
    # the quadrotor's split: 18 measured rows (16 on the tensor cores + 2 outer products) and the
    # 32-row action history; and three blocks with one of a single row
    for cuts in ((18,), (1, 18)):
        parts = jnp.split(x, cuts)
        assert jnp.max(jnp.abs(jax.jit(actor)(*parts) - ref)) < 1e-5


def test_pallas_actor_rejects_bad_input():
    _, params = _params()
    actor = make_pallas_actor(params, block_size=64, interpret=True)
    with pytest.raises(ValueError, match=r"obs must be \[50, B\]"):
        actor(jnp.zeros((49, 64)))
    with pytest.raises(
        ValueError, match=r"row blocks adding up to it\), got \(18, 64\), \(31, 64\)"
    ):
        actor(jnp.zeros((18, 64)), jnp.zeros((31, 64)))
    with pytest.raises(ValueError, match="batches differ"):
        actor(jnp.zeros((18, 64)), jnp.zeros((32, 128)))
    with pytest.raises(ValueError, match="multiple of block_size"):
        actor(jnp.zeros((F, 96)))
    with pytest.raises(ValueError, match="power of two"):
        make_pallas_actor(params, block_size=100)
    with pytest.raises(ValueError, match="programs must be ≥ 0"):
        make_pallas_actor(params, programs=-1)
    with pytest.raises(ValueError, match="unknown activation"):
        make_pallas_actor(params, activation="gelu")
    _, odd = _params(NetworkConfig(actor_hidden=(48,)))
    with pytest.raises(ValueError, match="powers of two ≥ 16, got 48"):
        make_pallas_actor(odd)


def test_pallas_actor_lowers_to_one_triton_kernel():
    _, params = _params()
    for programs in (0, 4):  # one block per program; 4 programs looping over 4 blocks each
        actor = make_pallas_actor(params, programs=programs, fast_tanh=True)
        lowered = jax.jit(actor).trace(jnp.zeros((F, 1024))).lower(lowering_platforms=("cuda",))
        assert lowered.as_text().count("xla.gpu.triton") == 1
    split = jax.jit(make_pallas_actor(params, fast_tanh=True)).trace(
        jnp.zeros((18, 1024)), jnp.zeros((32, 1024))
    )
    assert split.lower(lowering_platforms=("cuda",)).as_text().count("xla.gpu.triton") == 1
