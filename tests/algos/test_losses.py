"""PPO maths (`algos.ppo.losses`) against hand-computed values and plain-Python oracles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.ppo import compute_gae, ppo_loss


def gae_oracle(rewards, values, dones, last_value, gamma, lam):
    """Plain loops over [T, B] numpy arrays, float64."""
    t_len, batch = rewards.shape
    adv = np.zeros((t_len, batch))
    for b in range(batch):
        running = 0.0
        for t in reversed(range(t_len)):
            next_value = last_value[b] if t == t_len - 1 else values[t + 1, b]
            nonterminal = 1.0 - dones[t, b]
            delta = rewards[t, b] + gamma * nonterminal * next_value - values[t, b]
            running = delta + gamma * lam * nonterminal * running
            adv[t, b] = running
    return adv, adv + values


def test_gae_hand_computed():
    # γ = 0.9, λ = 0.8; the episode ends at t = 1.
    # δ2 = 3 + 0.9·2.0 − 1.5 = 3.3;            A2 = 3.3
    # δ1 = 2 + 0 − 1.0 = 1.0;                   A1 = 1.0 (no carry across the end)
    # δ0 = 1 + 0.9·1.0 − 0.5 = 1.4;             A0 = 1.4 + 0.9·0.8·1.0 = 2.12
    rewards = jnp.array([[1.0], [2.0], [3.0]])
    values = jnp.array([[0.5], [1.0], [1.5]])
    dones = jnp.array([[0.0], [1.0], [0.0]])
    adv, ret = compute_gae(rewards, values, dones, jnp.array([2.0]), gamma=0.9, gae_lambda=0.8)
    np.testing.assert_allclose(adv[:, 0], [2.12, 1.0, 3.3], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [2.62, 2.0, 4.8], rtol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0), (0.5, 0.5)])
def test_gae_matches_loop_oracle(gamma, lam):
    rng = np.random.default_rng(int(gamma * 100 + lam * 10))
    t_len, batch = 37, 6
    rewards = rng.normal(size=(t_len, batch))
    values = rng.normal(size=(t_len, batch))
    dones = (rng.uniform(size=(t_len, batch)) < 0.15).astype(np.float64)
    last = rng.normal(size=batch)
    adv, ret = compute_gae(
        *(jnp.asarray(x, jnp.float32) for x in (rewards, values, dones, last)),
        gamma=gamma,
        gae_lambda=lam,
    )
    want_adv, want_ret = gae_oracle(rewards, values, dones, last, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_gae_special_cases():
    rng = np.random.default_rng(1)
    r, v = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    last = rng.normal(size=2)
    args = [jnp.asarray(x, jnp.float32) for x in (r, v, np.zeros((5, 2)), last)]
    # λ = 0: one-step TD errors.
    adv, _ = compute_gae(*args, gamma=0.9, gae_lambda=0.0)
    nv = np.concatenate([v[1:], last[None]])
    np.testing.assert_allclose(adv, r + 0.9 * nv - v, rtol=1e-5, atol=1e-6)
    # λ = 1, no dones: returns are discounted reward-to-go bootstrapped with the last value.
    _, ret = compute_gae(*args, gamma=0.9, gae_lambda=1.0)
    want = np.zeros_like(r)
    g = last
    for t in reversed(range(5)):
        g = r[t] + 0.9 * g
        want[t] = g
    np.testing.assert_allclose(ret, want, rtol=1e-5, atol=1e-5)


def ppo_oracle(logp, old_logp, adv, values, returns, entropy, eps, vf, ent):
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(logp - old_logp)
    pg = -np.mean(np.minimum(ratio * a, np.clip(ratio, 1 - eps, 1 + eps) * a))
    v = 0.5 * np.mean((values - returns) ** 2)
    return pg + vf * v - ent * entropy, pg, v


def _random_batch(seed, n=64, spread=0.5):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=n)
    return dict(
        log_prob=old + rng.normal(0, spread, n),
        old_log_prob=old,
        advantages=rng.normal(1.0, 2.0, n),
        values=rng.normal(size=n),
        returns=rng.normal(size=n),
        entropy=np.float64(rng.uniform(0, 3)),
    )


@pytest.mark.parametrize("seed", range(4))
def test_ppo_loss_matches_numpy_oracle(seed):
    b = _random_batch(seed)
    loss, m = ppo_loss(
        **{k: jnp.asarray(v, jnp.float32) for k, v in b.items()},
        clip_eps=0.2,
        vf_coef=0.5,
        ent_coef=0.01,
    )
    want, pg, vf = ppo_oracle(*b.values(), 0.2, 0.5, 0.01)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m["loss/policy"], pg, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m["loss/value"], vf, rtol=1e-5)
    ratio = np.exp(b["log_prob"] - b["old_log_prob"])
    np.testing.assert_allclose(m["clip_fraction"], np.mean(np.abs(ratio - 1) > 0.2), atol=1e-6)
    np.testing.assert_allclose(m["approx_kl"], np.mean(ratio - 1 - np.log(ratio)), rtol=1e-4)
    assert float(m["approx_kl"]) >= 0


def test_ratio_one_gives_zero_policy_loss():
    b = _random_batch(5, spread=0.0)
    _, m = ppo_loss(
        **{k: jnp.asarray(v, jnp.float32) for k, v in b.items()},
        clip_eps=0.2,
        vf_coef=0.0,
        ent_coef=0.0,
    )
    # pg = −mean(normalized advantages) = 0; nothing is clipped; KL is 0.
    assert abs(float(m["loss/policy"])) < 1e-6
    assert float(m["clip_fraction"]) == 0 and abs(float(m["approx_kl"])) < 1e-7


def test_clipping_zeroes_the_gradient_outside_the_trust_region():
    """∂L/∂log π vanishes where the clipped term is active.

    That is ρ > 1+ε with A > 0, and ρ < 1−ε with A < 0.
    """
    adv = jnp.array([1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    log_ratio = jnp.log(jnp.array([1.5, 0.7, 0.5, 1.3, 1.1, 0.9, 0.5, 1.5]))
    old = jnp.zeros(8)

    def pg(logp):
        return ppo_loss(logp, old, adv, jnp.zeros(8), jnp.zeros(8), jnp.zeros(()), 0.2, 0.0, 0.0)[0]

    grad = np.asarray(jax.grad(pg)(log_ratio))
    clipped = np.array([True, False, True, False, False, False, False, False])
    np.testing.assert_array_equal(grad[clipped], 0.0)
    assert np.all(grad[~clipped] != 0)
    # Unclipped: ∂/∂log π of −ρ·Â/N is −ρ·Â/N (Â = ±1/std here, normalized adv has mean 0).
    a_hat = np.asarray((adv - adv.mean()) / (adv.std() + 1e-8))
    np.testing.assert_allclose(
        grad[~clipped], -np.exp(log_ratio[~clipped]) * a_hat[~clipped] / 8, rtol=1e-5
    )


def test_value_and_entropy_terms():
    n = 16
    values, returns = jnp.arange(n, dtype=jnp.float32), jnp.zeros(n)
    base = dict(
        log_prob=jnp.zeros(n),
        old_log_prob=jnp.zeros(n),
        advantages=jnp.ones(n),
        values=values,
        returns=returns,
        entropy=jnp.float32(2.0),
        clip_eps=0.2,
    )
    loss, m = ppo_loss(**base, vf_coef=0.5, ent_coef=0.1)
    vf = 0.5 * np.mean(np.arange(n) ** 2.0)
    np.testing.assert_allclose(m["loss/value"], vf, rtol=1e-6)
    # Constant advantages normalize to 0, so pg = 0.
    np.testing.assert_allclose(loss, 0.5 * vf - 0.1 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda v: ppo_loss(**{**base, "values": v}, vf_coef=1.0, ent_coef=0.0)[0])(values),
        np.arange(n) / n,
        rtol=1e-6,
    )
