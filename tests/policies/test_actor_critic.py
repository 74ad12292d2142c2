"""Actor-critic init/apply shapes, initial mean head, Gaussian log-density and entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from policies import (
    NetworkConfig,
    gaussian_entropy,
    gaussian_log_prob,
    init_normalizer,
    make_actor_critic,
    make_policy,
    mlp_tap_grads,
    update_normalizer,
)

OBS, CRITIC_OBS, ACT = 14, 20, 4
CFG = NetworkConfig(actor_hidden=(32, 32), critic_hidden=(16,), init_log_std=-0.7)
BIAS = jnp.array([0.33, 0.33, 0.33, 0.33])


@pytest.fixture(scope="module")
def net():
    ac = make_actor_critic(CFG, OBS, CRITIC_OBS, ACT, action_bias=BIAS)
    return ac, ac.init(jax.random.key(0))


def test_params_and_shapes(net):
    ac, params = net
    assert set(params) == {"actor", "critic", "log_std", "obs_norm", "critic_norm"}
    np.testing.assert_array_equal(params["log_std"], np.full(ACT, -0.7, np.float32))
    assert params["obs_norm"].mean.shape == (OBS,) and params["critic_norm"].mean.shape == (
        CRITIC_OBS,
    )
    kernels = [p.shape for p in jax.tree.leaves(params["actor"]) if p.ndim == 2]
    assert kernels == [(OBS, 32), (32, 32), (32, ACT)]
    obs = jax.random.normal(jax.random.key(1), (7, 3, OBS))
    mean, log_std = ac.actor(params, obs)
    assert mean.shape == (7, 3, ACT) and log_std.shape == (ACT,)
    assert ac.critic(params, jax.random.normal(jax.random.key(2), (7, 3, CRITIC_OBS))).shape == (
        7,
        3,
    )
    assert ac.actor(params, obs[0, 0])[0].shape == (ACT,)  # unbatched works too


def test_initial_mean_is_near_action_bias(net):
    ac, params = net
    mean, _ = ac.actor(params, 3.0 * jax.random.normal(jax.random.key(3), (256, OBS)))
    assert np.abs(np.asarray(mean) - np.asarray(BIAS)).max() < 0.1  # output layer gain 0.01
    np.testing.assert_allclose(np.asarray(mean).mean(0), BIAS, atol=0.02)


def test_init_is_deterministic_per_key():
    ac = make_actor_critic(CFG, OBS, CRITIC_OBS, ACT)
    a, b, c = ac.init(jax.random.key(5)), ac.init(jax.random.key(5)), ac.init(jax.random.key(6))
    assert all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
    assert not np.array_equal(
        a["actor"]["params"]["Dense_0"]["kernel"], c["actor"]["params"]["Dense_0"]["kernel"]
    )


def test_actor_normalizes_its_input(net):
    ac, params = net
    data = 5.0 + 2.0 * jax.random.normal(jax.random.key(4), (100, OBS))
    fitted = {**params, "obs_norm": update_normalizer(init_normalizer(OBS), data)}
    ns = fitted["obs_norm"]
    x = data[:5]
    np.testing.assert_allclose(
        ac.actor(fitted, x)[0], ac.actor(params, (x - ns.mean) / jnp.sqrt(ns.var))[0], atol=1e-5
    )


def test_gaussian_log_prob_and_entropy_match_scipy():
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(6, ACT))
    log_std = rng.uniform(-2, 1, ACT)
    x = rng.normal(size=(6, ACT)) * 2
    want = stats.norm.logpdf(x, mean, np.exp(log_std)).sum(-1)
    got = gaussian_log_prob(jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(x))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(
        gaussian_entropy(jnp.asarray(log_std)),
        stats.norm.entropy(scale=np.exp(log_std)).sum(),
        rtol=1e-5,
    )


def test_policy_sampling(net):
    ac, params = net
    obs = jax.random.normal(jax.random.key(7), (4000, OBS))
    mean, log_std = ac.actor(params, obs)
    action, extras = make_policy(ac, params)(obs, jax.random.key(8))
    raw = extras["raw_action"]
    assert float(jnp.abs(action).max()) <= 1.0
    np.testing.assert_array_equal(action, jnp.clip(raw, -1, 1))
    np.testing.assert_allclose(extras["log_prob"], gaussian_log_prob(mean, log_std, raw), rtol=1e-6)
    z = np.asarray((raw - mean) / jnp.exp(log_std))
    np.testing.assert_allclose(z.std(0), 1.0, rtol=0.05)
    det, extras = make_policy(ac, params, deterministic=True)(obs, jax.random.key(8))
    np.testing.assert_array_equal(det, jnp.clip(mean, -1, 1))
    assert extras == {}


def test_tapped_actor_gives_the_actor_and_its_weight_gradients_outside_a_loop(net):
    """`actor_taps` with zero taps is `actor`; in a differentiated loop whose weights enter
    stopped, Σ_t inputᵀ·(tap cotangent) over the steps is autodiff's weight gradient (APG's use)."""
    ac, params = net
    widths = (*CFG.actor_hidden, ACT)
    steps, batch = 5, 3
    obs0 = jax.random.normal(jax.random.key(9), (batch, OBS))
    zero = [jnp.zeros((batch, w)) for w in widths]
    mean, inputs = ac.actor_taps(params, obs0, zero)
    np.testing.assert_allclose(mean, ac.actor(params, obs0)[0], atol=1e-6)
    assert [x.shape for x in inputs] == [(batch, OBS), (batch, 32), (batch, 32)]
    mix = jax.random.normal(jax.random.key(10), (ACT, OBS))

    def rollout(actor, taps):  # obs feed back through the actions, as a simulator's do
        def step(obs, tap):
            a, ins = ac.actor_taps({**params, "actor": actor}, obs, tap)
            return jnp.tanh(obs + a @ mix), (jnp.sum(a**2), ins)

        _, (cost, ins) = jax.lax.scan(step, obs0, taps)
        return cost.sum(), ins

    taps = [jnp.zeros((steps, batch, w)) for w in widths]
    want = jax.grad(lambda p: rollout(p, taps)[0])(params["actor"])
    stopped = jax.lax.stop_gradient(params["actor"])
    cot, ins = jax.grad(lambda t: rollout(stopped, t), has_aux=True)(taps)
    got = mlp_tap_grads(ins, cot)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)
    for layer in want["params"].values():
        assert float(jnp.abs(layer["kernel"]).max()) > 1e-4  # a gradient that can be wrong


def test_tapped_actor_needs_one_tap_per_layer(net):
    ac, params = net
    with pytest.raises(ValueError, match="2 taps for an MLP of 3 Dense layers"):
        ac.actor_taps(params, jnp.zeros((1, OBS)), [jnp.zeros((1, 32))] * 2)
