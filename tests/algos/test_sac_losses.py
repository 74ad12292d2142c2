"""SAC maths against hand-computed oracles, and the squashed Gaussian against scipy's density."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from algos.sac import actor_loss, alpha_loss, critic_loss, critic_target, polyak_update
from policies.sac import sample_squashed


def test_critic_target_takes_the_min_subtracts_entropy_and_cuts_on_termination():
    reward = jnp.array([1.0, 2.0, -5.0])
    done = jnp.array([0.0, 0.0, 1.0])
    next_q = jnp.array([[10.0, 4.0, 100.0], [8.0, 6.0, 100.0]])
    next_logp = jnp.array([-2.0, 1.0, 3.0])
    y = critic_target(reward, done, next_q, next_logp, jnp.asarray(0.5), 0.9)
    # y0 = 1 + 0.9 (min(10, 8) + 0.5·2) = 9.1; y1 = 2 + 0.9 (4 − 0.5) = 5.15; y2 = −5 (terminal)
    np.testing.assert_allclose(y, [9.1, 5.15, -5.0], rtol=1e-6)
    # The target is a constant for the critic's gradient.
    grad = jax.grad(lambda q: critic_target(reward, done, q, next_logp, 0.5, 0.9).sum())(next_q)
    assert np.all(np.asarray(grad) == 0)


def test_critic_loss_leaves_out_time_outs():
    q = jnp.array([[1.0, 2.0, 30.0], [3.0, 2.0, -30.0]])
    y = jnp.array([2.0, 0.0, 0.0])
    mask = jnp.array([1.0, 1.0, 0.0])  # the third transition was truncated
    # ½ · [((1−2)² + (3−2)²) + ((2−0)² + (2−0)²)] / 2 = ½ · (2 + 8) / 2 = 2.5
    np.testing.assert_allclose(critic_loss(q, y, mask), 2.5, rtol=1e-6)
    # Changing the masked transition's Q or target changes nothing.
    np.testing.assert_allclose(critic_loss(q.at[:, 2].set(7.0), y.at[2].set(-9.0), mask), 2.5)
    np.testing.assert_allclose(critic_loss(q, y, jnp.zeros(3)), 0.0)


def test_actor_loss():
    q = jnp.array([[1.0, 5.0], [2.0, 3.0]])
    logp = jnp.array([-1.0, 2.0])
    # mean(0.1·(−1) − 1, 0.1·2 − 3) = (−1.1 − 2.8) / 2
    np.testing.assert_allclose(actor_loss(q, logp, jnp.asarray(0.1)), -1.95, rtol=1e-6)


@pytest.mark.parametrize(("logp", "sign"), [(3.0, -1.0), (5.0, 1.0)])
def test_alpha_loss_gradient_moves_alpha_toward_the_target_entropy(logp, sign):
    """Target entropy −4. log π = 3 (entropy −3, above the target) must lower α; log π = 5
    (entropy −5, below it) must raise it. Oracle: ∂L/∂log α = −α·mean(log π + H̄)."""
    log_alpha = jnp.log(0.2)
    grad = jax.grad(alpha_loss)(log_alpha, jnp.full(8, logp), -4.0)
    np.testing.assert_allclose(grad, -0.2 * (logp - 4.0), rtol=1e-5)
    assert np.sign(-grad) == sign  # the direction of a gradient-descent step on log α


def test_polyak_update():
    online = {"a": jnp.array([1.0, 2.0]), "b": {"c": jnp.array(10.0)}}
    target = {"a": jnp.array([0.0, 4.0]), "b": {"c": jnp.array(0.0)}}
    out = polyak_update(online, target, 0.1)
    np.testing.assert_allclose(out["a"], [0.1, 3.8], rtol=1e-6)
    np.testing.assert_allclose(out["b"]["c"], 1.0, rtol=1e-6)
    same = polyak_update(online, target, 1.0)
    np.testing.assert_allclose(same["a"], online["a"])


def test_squashed_log_prob_matches_the_change_of_variables_density():
    """p_a(a) = Π_i N(arctanh a_i; μ_i, σ_i) / (1 − a_i²), from scipy's normal density."""
    mean = jnp.array([[0.3, -1.2, 2.5]] * 4096)
    log_std = jnp.array([-1.0, 0.0, 0.5])
    a, logp = sample_squashed(mean, log_std, jax.random.key(0))
    a64 = np.asarray(a, np.float64)
    u = np.arctanh(np.clip(a64, -1 + 1e-7, 1 - 1e-7))
    oracle = np.sum(
        stats.norm.logpdf(u, np.asarray(mean), np.exp(np.asarray(log_std))) - np.log1p(-(a64**2)),
        axis=-1,
    )
    ok = np.all(np.abs(a64) < 0.999, axis=-1)  # the oracle loses precision next to ±1
    assert ok.mean() > 0.5
    np.testing.assert_allclose(np.asarray(logp)[ok], oracle[ok], rtol=1e-3, atol=1e-3)
    assert np.all(np.abs(np.asarray(a)) <= 1.0) and np.all(np.isfinite(np.asarray(logp)))
    # Reparameterized: the sample is differentiable in the mean.
    g = jax.grad(lambda m: sample_squashed(m, log_std, jax.random.key(0))[0].sum())(mean)
    assert np.all(np.asarray(g) >= 0) and np.mean(np.asarray(g) > 0) > 0.99
