"""The fused quadrotor rollout kernel (Pallas' interpreter on the CPU) against XLA's step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.fused_rollout import make_fused_rollout
from policies import NetworkConfig, make_actor_critic, make_policy
from sim import ObservationSubset, make_env, wrap_for_training
from sim.quadrotor import QuadrotorConfig

B, STEPS = 64, 24


def _setup(task, config, randomization, episode_length):
    kwargs = {} if randomization else {"randomization": None}
    quad = make_env(task, config, **kwargs)
    env = wrap_for_training(ObservationSubset(quad, head=18), episode_length, batch_axis=-1)
    state = jax.jit(env.reset)(jax.random.split(jax.random.key(0), B))
    sizes = quad.observation_size
    ac = make_actor_critic(
        NetworkConfig(actor_hidden=(32, 16)),
        sizes["state"][0],
        sizes["privileged_state"][0],
        4,
        action_bias=float(env.default_action[0]),
    )
    return env, state, ac, ac.init(jax.random.key(1))


def _xla_rollout(env, ac, net, state, steps):
    policy = jax.vmap(make_policy(ac, net, deterministic=True), in_axes=(-1, None), out_axes=-1)
    history = 4 * env.unwrapped.config.action_history

    def body(carry, _):
        s, resets = carry
        obs = jnp.concatenate([s.obs["state"], s.data.actions[: history // 4].reshape(history, B)])
        s = env.step(s, policy(obs, jax.random.key(0))[0])
        return (s, resets + s.done), None

    (s, resets), _ = jax.lax.scan(body, (state, jnp.zeros(B)), None, length=steps)
    return s, jnp.sum(resets)


@pytest.mark.parametrize(
    "task, config, randomization",
    [
        # crashes (a 0.3 m box) and truncations, domain randomization
        ("quadrotor-hover", QuadrotorConfig(termination_distance=0.3), True),
        # the figure-eight, a delayed action and a shorter history, nominal dynamics
        ("quadrotor-track", QuadrotorConfig(action_delay=1, action_history=4), False),
    ],
)
def test_fused_rollout_matches_xla_step(task, config, randomization):
    env, state, ac, net = _setup(task, config, randomization, episode_length=10)
    fused = make_fused_rollout(env, net, STEPS, block_size=32, interpret=True)
    want, want_resets = jax.jit(_xla_rollout, static_argnums=(0, 1, 4))(env, ac, net, state, STEPS)
    got, got_resets = jax.jit(fused)(state)
    assert int(got_resets) == int(want_resets) >= 2 * B  # every env reset at least twice
    leaves = jax.tree_util.tree_flatten_with_path(want)[0]
    for (path, w), g in zip(leaves, jax.tree.leaves(got), strict=True):
        name = jax.tree_util.keystr(path)
        if jnp.issubdtype(w.dtype, jax.dtypes.prng_key):
            w, g = jax.random.key_data(w), jax.random.key_data(g)
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if jnp.issubdtype(w.dtype, jnp.floating):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_fused_rollout_refuses_other_envs():
    env, state, ac, net = _setup("quadrotor-hover", QuadrotorConfig(), True, 500)
    batch_first = wrap_for_training(ObservationSubset(env.unwrapped, head=18), 500)
    with pytest.raises(ValueError, match="needs the env .* got AutoResetWrapper"):
        make_fused_rollout(batch_first, net, 4)
    short = make_env("quadrotor-hover", dataclasses.replace(QuadrotorConfig(), action_history=2))
    other = wrap_for_training(ObservationSubset(short, head=18), 500, batch_axis=-1)
    with pytest.raises(ValueError, match="actor reads 50 observations, the env gives 18 \\+ 8"):
        make_fused_rollout(other, net, 4)
    with pytest.raises(ValueError, match="multiple of block_size"):
        make_fused_rollout(env, net, 4, block_size=128, interpret=True)(state)
