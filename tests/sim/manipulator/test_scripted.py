"""The scripted pick-and-place base: it succeeds on nominal episodes and fails under perturbations
(`sim.manipulator.perturb`), and the perturbations do what they say (real MJX).

One batch, compiled once for the module: half of the episodes perturbed (`episode_prob` 0.5, every
perturbed episode pushed), the others nominal (default domain randomization only)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.residual import ResidualWrapper
from sim import make_env
from sim.manipulator import (
    ArmConfig,
    ArmEnv,
    Perturbation,
    PerturbationConfig,
    ScriptedConfig,
    make_scripted_base,
    obs_fields,
)
from sim.manipulator.scripted import PHASES

pytestmark = pytest.mark.xdist_group("scripted")  # `episodes` compiles once (-n 2)

B, T = 32, 250
PERTURBATION = PerturbationConfig(episode_prob=0.5, push_prob=1.0)


def _layout() -> dict[str, slice]:
    layout, start = {}, 0
    for name, size in obs_fields(4):
        layout[name] = slice(start, start + size)
        start += size
    return layout


L = _layout()


@pytest.fixture(scope="module")
def env():
    arm = ArmConfig(task="pick_place", action_space="cartesian", episode_steps=T)
    return Perturbation(make_env("arm-pick-place", arm), PERTURBATION)


@pytest.fixture(scope="module")
def episodes(env):
    """B episodes of T steps of the scripted base, as host arrays."""
    base = make_scripted_base(env.unwrapped)

    def run(key):
        state = jax.vmap(env.reset)(jax.random.split(key, B))
        carry = jax.vmap(lambda _: base.init())(jnp.arange(B))

        def step(c, _):
            state, carry = c
            action, carry = jax.vmap(base.apply)(state.obs["state"], carry)
            state = jax.vmap(env.step)(state, action)
            out = {
                "success": state.metrics["success"],
                "obs": state.obs["state"],
                "privileged": state.obs["privileged_state"],
            }
            return (state, carry), out

        (last, _), traj = jax.lax.scan(step, (state, carry), None, T)
        return traj | {k: last.info[f"perturb/{k}"] for k in ("active", "push_step")}

    out = jax.jit(run, compiler_options=env.compiler_options)(jax.random.key(0))
    return jax.device_get(out)


def test_base_succeeds_nominally_and_fails_under_perturbations(episodes):
    final = episodes["success"][-1] > 0
    active = episodes["active"] > 0
    assert 8 <= active.sum() <= B - 8
    nominal, perturbed = final[~active].mean(), final[active].mean()
    assert nominal >= 0.8, (nominal, perturbed)
    assert perturbed <= nominal - 0.3, (nominal, perturbed)


def test_detection_is_consistent_and_drops_out(episodes):
    obs, active = episodes["obs"], episodes["active"] > 0
    cube, tcp, goal = obs[..., L["cube_pos"]], obs[..., L["tcp_pos"]], obs[..., L["goal_pos"]]
    np.testing.assert_allclose(obs[..., L["cube_minus_tcp"]], cube - tcp, atol=1e-6)
    np.testing.assert_allclose(obs[..., L["goal_minus_cube"]], goal - cube, atol=1e-6)
    repeated = np.all(cube[1:] == cube[:-1], axis=-1).sum(0)  # [B] missed detections
    assert np.all(repeated[active] > 0) and np.all(repeated[~active] == 0)
    true_cube = episodes["privileged"][..., L["cube_pos"]]  # the critic's view stays clean
    error = np.abs(cube - true_cube).mean(axis=(0, 2))
    assert error[active].mean() > 2 * error[~active].mean()


def test_push_kicks_the_cube(episodes):
    n = sum(size for _, size in obs_fields(4))
    cube_vel = episodes["privileged"][..., n : n + 2]  # [T, B, 2] world m/s
    k = episodes["push_step"]
    assert np.all((k >= 0) == (episodes["active"] > 0))
    for b in np.flatnonzero(k >= 0):
        # pushed after step k's physics; the observation of step k + 1 sees it
        assert np.linalg.norm(cube_vel[k[b], b]) > 0.2, (b, k[b])


def test_resume_carries_a_held_cube_and_restarts_otherwise(env, episodes):
    """`resume` (an expert taking over from another policy): from the state of a nominal
    episode in CARRY it carries on to the goal with the in-hand offset measured there; before
    the grasp it starts from the beginning, as `init`."""
    base = make_scripted_base(env.unwrapped)
    obs, final = episodes["obs"], episodes["success"][-1] > 0
    b = int(np.flatnonzero(final & (episodes["active"] == 0))[0])
    closed = obs[:, b, L["last_action"]][:, 3] < 0
    near = np.linalg.norm(obs[:, b, L["cube_minus_tcp"]], axis=-1) < 0.03
    lifted = obs[:, b, L["cube_pos"]][:, 2] > obs[0, b, L["cube_pos"]][2] + 0.05
    k = int(np.flatnonzero(closed & near & lifted)[0])
    held = base.resume(jnp.asarray(obs[k, b]))
    assert int(held.phase) == PHASES.index("carry")
    np.testing.assert_allclose(held.offset, obs[k, b, L["cube_minus_tcp"]], atol=1e-6)
    action, _ = base.apply(jnp.asarray(obs[k, b]), held)
    to_goal = obs[k, b, L["goal_minus_cube"]]
    assert action[3] == -1.0 and np.dot(action[:3], to_goal) > 0  # closed, towards the goal
    for t in (0, int(np.flatnonzero(~closed & near)[0])):  # at the start; open at the cube
        fresh = base.resume(jnp.asarray(obs[t, b]))
        jax.tree.map(np.testing.assert_array_equal, fresh, base.init())


def test_scripted_base_fits_the_residual_wrapper(env):
    base = make_scripted_base(env.unwrapped)
    wrapped = ResidualWrapper(env, base)
    assert wrapped.observation_size["state"] == (base.obs_size + 4,)


def test_configs_and_env_are_checked():
    with pytest.raises(ValueError, match="cartesian"):
        make_scripted_base(ArmEnv(ArmConfig(task="pick_place")))
    with pytest.raises(ValueError, match="gain"):
        ScriptedConfig(gain=0.0).validate()
    with pytest.raises(ValueError, match="push_prob"):
        PerturbationConfig(push_prob=1.5).validate()
    with pytest.raises(ValueError, match="push_window"):
        PerturbationConfig(push_window=(50, 10)).validate()
