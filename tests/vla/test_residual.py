"""Residual RL on a frozen VLA (`vla.residual`): the base plans as the closed-loop evaluator of
`vla.sft` does, re-plans every K steps, the wrapper with zero correction is the base alone,
and the base is registered for run folders (training is `algos.runner.train`, tested with the
other bases in tests/algos; a VLA-residual run compiles the MJX arm twice: minutes on CI's CPU).

A tiny random-weight TEST-preset checkpoint is written directly (no dataset: the env info goes
into its train_state.pt), so the only slow part is compiling the MJX arm (one compile for the
base tests)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from algos import run_folder
from algos.residual import ResidualConfig, ResidualScale, ResidualWrapper
from sim.manipulator import CameraRenderer, make_scripted_base
from vla.checkpoint import save_checkpoint
from vla.collect import (
    FAST_COMPILE,
    STATE_FIELDS,
    TARGETS,
    CollectConfig,
    collect,
    collect_arm_config,
    goal_region,
    instruction,
    make_collect_env,
    rollout_episodes,
    state_index,
)
from vla.configuration_hoverfly_vla import TEST
from vla.dataset import LeRobotDataset
from vla.modeling_hoverfly_vla import HoverflyVLA
from vla.processor_hoverfly_vla import HoverflyVLAProcessor, compute_norm_stats
from vla.residual import VLAResidualConfig, make_vla_base, residual_train_config
from vla.sft import _plan

pytestmark = [
    pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning"),  # ffmpeg, EGL probe
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.xdist_group("vla_residual"),  # its module fixtures compile once (-n 2)
]

B, T = 3, 8  # envs; steps (2 chunks of K = 4)
SEEDS = jnp.arange(3, 3 + B, dtype=jnp.uint32)  # reset seeds of the wrapper tests
COLLECT = CollectConfig(image_size=(32, 32), max_steps=12, colours=("red", "blue"))
TAKEOVER = dataclasses.replace(
    COLLECT, episodes=3, batch_size=3, keep_failures=True, image_dtype="image", takeover=(2, 6)
)  # with a student: takeovers at steps 2-6 of 12


def _checkpoint(path, collect: CollectConfig, seed: int = 0):
    """A random TEST-preset VLA for the arm (12 states, 4 actions) with `collect`'s env info."""
    config = TEST.replace(proprio_dim=12, action_dim=4)
    model = HoverflyVLA(config, torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(1)
    stats = compute_norm_stats(
        torch.randn(32, 12, generator=g), 0.3 * torch.randn(32, config.chunk_size, 4, generator=g)
    )
    info = {"collect": dataclasses.asdict(collect), "state_fields": list(STATE_FIELDS)}
    return save_checkpoint(
        path, model, HoverflyVLAProcessor(config, stats), {"env_info": json.dumps(info)}
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("vla") / "ckpt", COLLECT)


@pytest.fixture(scope="module")
def wrapped(checkpoint):
    """(env, base, wrapper, roll): roll(seeds [B], progress, residual [T, B, A]) -> (first
    state, last state, per-step outputs [T, B, ...]) of the wrapper reset from `seeds`, whose
    scale is 0 at progress 0 and 0.5 at progress 1 (one compile for every case)."""
    env = make_collect_env(COLLECT)
    base = make_vla_base(checkpoint, env, device="cpu")
    w = ResidualWrapper(env, base, ResidualScale(start=0.0, end=0.5, ramp=1.0))

    def roll(seeds, progress, residual):
        first = jax.vmap(w.reset)(jax.vmap(jax.random.key)(seeds))
        first = first.replace(info={**first.info, "progress": jnp.full(B, progress)})

        def step(s, a):
            ns = jax.vmap(w.step)(s, a)
            out = {
                "base_action": s.info["base_action"],
                "chunk_step": s.info["base_state"].step,
                "qpos": ns.data.physics.qpos,
                "correction": ns.metrics["residual/correction"],
                "scale": ns.metrics["residual/scale"],
            }
            return ns, out

        last, out = jax.lax.scan(step, first, residual)
        return first, last, out

    opts = env.compiler_options | FAST_COMPILE
    return env, base, w, jax.jit(roll, compiler_options=opts)


@pytest.fixture(scope="module")
def reset(wrapped):
    """reset(seeds [N ≤ B]) -> the wrapper's states reset from those seeds (`roll`'s first
    states: no other compile)."""
    roll = wrapped[3]

    def reset(seeds):
        padded = jnp.asarray(np.resize(np.asarray(seeds, np.uint32), B))
        first, _, _ = roll(padded, 0.0, jnp.zeros((T, B, 4)))
        return jax.tree.map(lambda x: x[: len(seeds)], first)

    return reset


def _plan_each(checkpoint, env, state, colours):
    """`vla.sft._plan` (the closed-loop evaluator's planner) on each env of a batched wrapper
    state alone, noise from a generator seeded like the base's fixed noise: [B, K, A]."""
    from vla.checkpoint import load_checkpoint

    model, processor = load_checkpoint(checkpoint)
    idx = jnp.asarray(state_index(STATE_FIELDS, 4))
    inner = state.replace(obs=state.info["inner_obs"])
    center = env.unwrapped.config.init.cube_center
    out = []
    with CameraRenderer(env, model.config.cameras, *COLLECT.image_size) as renderer:
        renderer.model.light_castshadow[:] = 0
        for b in range(B):
            one = jax.tree.map(lambda x, b=b: x[b : b + 1], inner)
            colour = COLLECT.colours[int(colours[b])]
            goal = np.asarray(one.data.goal[0])
            texts = [instruction(colour, goal_region(goal[:2], center))]
            look = ([colour], env.unwrapped.index.cube_geom)
            gen = torch.Generator().manual_seed(0)  # = noise_seed: the same first draw
            actions = _plan(model, processor, renderer, one, idx, texts, look, gen)
            out.append(np.asarray(actions)[:, 0])
    return np.stack(out)


def test_base_plans_like_the_closed_loop_evaluator_and_replans_every_k(checkpoint, wrapped):
    env, base, _, roll = wrapped
    planner = base.apply.planner
    plans = planner.plans
    k = 4
    rng = np.random.default_rng(0)
    residual = jnp.asarray(rng.uniform(-1, 1, (T, B, 4)), jnp.float32)
    first, last, out = jax.device_get(roll(SEEDS, 0.0, residual))
    assert planner.plans - plans == B * (1 + T // k)  # at reset, after K and after 2K steps
    carry0, carry = first.info["base_state"], last.info["base_state"]
    assert set(np.asarray(carry0.colour)) <= {0, 1}
    # the chunk at reset and the one re-planned after 2K steps are `_plan`'s for the same state
    np.testing.assert_allclose(
        carry0.chunk, _plan_each(checkpoint, env, first, carry0.colour), atol=2e-5
    )
    np.testing.assert_allclose(
        carry.chunk, _plan_each(checkpoint, env, last, carry.colour), atol=2e-5
    )
    assert np.array_equal(carry.colour, carry0.colour)  # the episode keeps its cube colour
    # features: the pooled prefix of the first plan (kept) and of the latest (re-planned)
    assert carry0.features.shape == (B, 2, 128) and not carry0.fresh.any()
    np.testing.assert_array_equal(carry0.features[:, 0], carry0.features[:, 1])
    np.testing.assert_array_equal(carry.features[:, 0], carry0.features[:, 0])
    assert not np.allclose(carry.features[:, 1], carry0.features[:, 1])
    # the base plays chunk[t mod K]: the reset chunk for t < K, then a new one
    steps = np.asarray(out["chunk_step"])
    assert np.array_equal(steps[:, 0], [1, 2, 3, 4, 1, 2, 3, 4])
    np.testing.assert_array_equal(out["base_action"][:k], np.swapaxes(carry0.chunk, 0, 1))
    assert not np.allclose(out["base_action"][k], out["base_action"][0])
    assert np.all(np.abs(out["base_action"]) <= 1.0)


def test_zero_correction_is_the_base_alone(wrapped):
    """Scale 0 with random residual actions (the base alone) and scale 0.5 with zero residual
    actions give bitwise the same episodes; a non-zero correction changes them."""
    _, _, _, roll = wrapped
    rng = np.random.default_rng(1)
    residual = jnp.asarray(rng.uniform(-1, 1, (T, B, 4)), jnp.float32)
    _, _, alone = jax.device_get(roll(SEEDS, 0.0, residual))
    _, _, zero = jax.device_get(roll(SEEDS, 1.0, jnp.zeros_like(residual)))
    for key in ("base_action", "qpos"):
        np.testing.assert_array_equal(alone[key], zero[key], err_msg=key)
    assert np.all(alone["correction"] == 0) and np.all(zero["correction"] == 0)
    assert np.all(alone["scale"] == 0) and np.all(zero["scale"] == 0.5)
    _, _, corrected = jax.device_get(roll(SEEDS, 1.0, residual))
    assert np.all(corrected["correction"] > 0)
    assert not np.array_equal(corrected["qpos"][-1], alone["qpos"][-1])


def test_the_view_base_shows_the_residual_what_the_vla_sees(checkpoint, wrapped):
    """`view=True`: the residual's observation is the VLA's proprio state and its two pooled
    prefixes (no object poses), the base action appended; the critic keeps the privileged
    state."""
    env, base, w, roll = wrapped
    view = make_vla_base(checkpoint, env, device="cpu", view=True)
    vw = ResidualWrapper(env, view)
    idx = np.asarray(state_index(STATE_FIELDS, 4))
    assert vw.observation_size["state"] == (len(idx) + 2 * 128 + 4,)
    assert vw.observation_size["privileged_state"] == w.observation_size["privileged_state"]
    first = jax.device_get(roll(SEEDS, 0.0, jnp.zeros((T, B, 4))))[0]
    carry, obs = first.info["base_state"], first.info["inner_obs"]["state"]
    seen = np.asarray(jax.vmap(view.observe)(jnp.asarray(obs), carry))
    np.testing.assert_array_equal(seen[:, : len(idx)], obs[:, idx])
    np.testing.assert_array_equal(seen[:, len(idx) :], carry.features.reshape(B, -1))
    cfg = residual_train_config(VLAResidualConfig(str(checkpoint), "unused", view="vla"))
    assert cfg.residual.base == "vla_view" and not cfg.residual.augmentation.fields
    with pytest.raises(ValueError, match="base_run"):
        ResidualConfig(base="vla_view").validate()


def test_base_checks_the_env(checkpoint):
    from sim import make_env
    from sim.manipulator import ArmConfig

    with pytest.raises(ValueError, match="cartesian"):
        make_vla_base(checkpoint, make_env("arm-reach", ArmConfig()), device="cpu")


def test_the_vla_base_is_registered_for_run_folders():
    from algos.residual import ResidualConfig, registered_base
    from vla import residual

    assert registered_base("vla") is residual._registered_vla_base
    with pytest.raises(ValueError, match="registered"):
        registered_base("no-such-base")
    with pytest.raises(ValueError, match="base_run"):
        ResidualConfig(base="vla").validate()


def test_the_residual_trains_in_the_demonstrations_env(checkpoint, tmp_path):
    cfg = residual_train_config(VLAResidualConfig(checkpoint=str(checkpoint), out=str(tmp_path)))
    assert cfg.algo == "ppo" and cfg.ppo == VLAResidualConfig.ppo
    sac = dataclasses.replace(VLAResidualConfig.sac, num_envs=8)
    off_policy = VLAResidualConfig(
        checkpoint=str(checkpoint), out=str(tmp_path), algo="sac", sac=sac
    )
    sac_run = residual_train_config(off_policy)
    assert (sac_run.algo, sac_run.sac) == ("sac", sac)
    assert cfg.arm == collect_arm_config(COLLECT)  # the named goal targets, the episode length
    assert cfg.arm.init.goal_targets == TARGETS and cfg.arm.episode_steps == COLLECT.max_steps
    plain = _checkpoint(tmp_path / "plain", dataclasses.replace(COLLECT, randomize=False))
    with pytest.raises(ValueError, match="without domain randomization"):
        residual_train_config(VLAResidualConfig(checkpoint=str(plain), out=str(tmp_path)))


def _constant_run(checkpoint, path, correction):
    """A VLA residual run folder (scale 0.5) whose residual always outputs `correction` [4]."""
    cfg = residual_train_config(
        VLAResidualConfig(checkpoint=str(checkpoint), out=str(path), scale=ResidualScale(0.5, 0.5))
    )
    params = jax.jit(run_folder.make_env_and_network(cfg)[1].init)(jax.random.key(0))
    actor = params["actor"]["params"]
    head = max(actor, key=lambda name: int(name.split("_")[-1]))  # the mean's Dense layer
    actor[head] = {"kernel": jnp.zeros_like(actor[head]["kernel"]), "bias": correction}
    path.mkdir()
    run_folder.write_config(path, cfg)
    opt_state = optax.adam(1e-3).init(params)
    key = jax.random.key(0)
    run_folder.save_checkpoint(path, 1, params, opt_state, key, run_folder.config_hash(cfg))
    return path


def test_a_residual_run_is_a_collect_expert(checkpoint, reset, tmp_path):
    """`CollectConfig.expert` = a VLA residual run: an episode's first recorded frame is its
    reset's (from the episode's reset seed) and its first action is the base's plus the scaled
    correction; the episode replays from its reset seed (`rollout_episodes`)."""
    correction = jnp.asarray([0.4, -0.4, 0.2, 0.0])
    run = _constant_run(checkpoint, tmp_path / "run", correction)
    cfg = dataclasses.replace(
        COLLECT, episodes=2, batch_size=B, keep_failures=True, image_dtype="image", expert=str(run)
    )
    data = collect(tmp_path / "data", cfg, progress=False, compiler_options=FAST_COMPILE)
    ds = LeRobotDataset(data)
    assert ds.info["hoverfly"]["collect"]["expert"] == str(run.resolve())
    seeds = [e.metadata["reset_seed"] for e in ds.episodes]
    first = reset(seeds)
    episodes = [ds.episode(e.index) for e in ds.episodes]
    recorded = np.stack([ep["observation.environment_state"] for ep in episodes])
    actions = np.stack([ep["action"] for ep in episodes])
    np.testing.assert_allclose(recorded[:, 0], first.info["inner_obs"]["state"], atol=1e-6)
    expected = np.clip(np.asarray(first.info["base_action"]) + 0.5 * correction, -1, 1)
    np.testing.assert_allclose(actions[:, 0], expected, atol=1e-6)
    replay = rollout_episodes(cfg, seeds, FAST_COMPILE)
    np.testing.assert_allclose(replay["obs"].swapaxes(0, 1), recorded, atol=1e-5)
    np.testing.assert_allclose(replay["action"].swapaxes(0, 1), actions, atol=1e-6)
    longer = dataclasses.replace(cfg, max_steps=COLLECT.max_steps + 1)
    with pytest.raises(ValueError, match="arm settings"):
        collect(tmp_path / "other", longer, progress=False)
    assert not (tmp_path / "other").exists()


def test_a_student_drives_until_the_expert_takes_over(checkpoint, wrapped, reset, tmp_path):
    """`CollectConfig.student`: a VLA drives from the reset until the expert takes over at a
    step of `takeover`; the episode is recorded from there, and its first action is the
    expert's base planning from the student's state plus the scaled correction."""
    _, base, w, _ = wrapped
    correction = jnp.asarray([0.4, -0.4, 0.2, 0.0])
    run = _constant_run(checkpoint, tmp_path / "run", correction)
    student = _checkpoint(tmp_path / "student", COLLECT, seed=2)
    cfg = dataclasses.replace(TAKEOVER, expert=str(run), student=str(student))
    ds = LeRobotDataset(
        collect(tmp_path / "data", cfg, progress=False, compiler_options=FAST_COMPILE)
    )
    seeds = [e.metadata["reset_seed"] for e in ds.episodes]
    takeovers = [e.metadata["takeover"] for e in ds.episodes]
    assert all(2 <= t <= 6 for t in takeovers)
    replay = rollout_episodes(cfg, seeds, FAST_COMPILE)
    np.testing.assert_array_equal(replay["takeover"], takeovers)
    first = reset(seeds)
    drives = make_vla_base(student, w.env, device="cpu")
    student_colour = jax.vmap(drives.init)(first).colour
    idx = state_index()
    for i, (t, e) in enumerate(zip(takeovers, ds.episodes, strict=True)):
        ep = ds.episode(e.index)
        assert len(ep["action"]) == COLLECT.max_steps - t  # failures kept: to the last step
        np.testing.assert_allclose(
            replay["obs"][t:, i], ep["observation.environment_state"], atol=1e-5
        )
        np.testing.assert_allclose(replay["action"][t:, i], ep["action"], atol=1e-6)

        def plan(planner, step, colour, i=i):  # on the planner's GL thread, as in the rollout
            args = (replay["qpos"][step, i], replay["mocap_pos"][step, i])
            args += (replay["cube_half_size"][i], replay["goal"][i], replay["obs"][step, i, idx])
            args = tuple(np.asarray(a)[None] for a in args) + (np.asarray([colour]),)
            return planner(np.ones(1, bool), *args)[0][0, 0]

        # the student's first action, from the reset; the expert's base, from the takeover state
        colour = first.info["base_state"].colour[i]
        np.testing.assert_allclose(
            replay["action"][0, i], plan(drives.apply.planner, 0, student_colour[i]), atol=1e-5
        )
        expected = np.clip(plan(base.apply.planner, t, colour) + 0.5 * correction, -1, 1)
        np.testing.assert_allclose(ep["action"][0], expected, atol=1e-5)
    with pytest.raises(ValueError, match="takeover"):
        dataclasses.replace(cfg, takeover=(2, COLLECT.max_steps)).validate()
    longer = _checkpoint(tmp_path / "longer", dataclasses.replace(COLLECT, max_steps=13))
    with pytest.raises(ValueError, match="other arm settings"):
        collect(tmp_path / "other", dataclasses.replace(cfg, student=str(longer)), progress=False)
    assert not (tmp_path / "other").exists()


def test_a_student_drives_until_the_scripted_expert_takes_over(checkpoint, wrapped, tmp_path):
    """With the scripted expert, the student drives until the takeover step and the expert
    resumes there: the recorded actions are the scripted policy's from `resume` of the first
    recorded state (its first phase: no cube is held this early), and the student's before them
    are not."""
    env = wrapped[0]
    cfg = dataclasses.replace(TAKEOVER, student=str(checkpoint))
    data = collect(tmp_path / "data", cfg, progress=False, compiler_options=FAST_COMPILE)
    ds = LeRobotDataset(data)
    replay = rollout_episodes(cfg, [e.metadata["reset_seed"] for e in ds.episodes], FAST_COMPILE)
    scripted = make_scripted_base(env.unwrapped)
    apply = jax.jit(scripted.apply)
    for i, e in enumerate(ds.episodes):
        ep, t = ds.episode(e.index), e.metadata["takeover"]
        assert 2 <= t <= 6 and len(ep["action"]) == COLLECT.max_steps - t
        assert replay["takeover"][i] == t
        states = ep["observation.environment_state"]
        carry, actions = scripted.resume(jnp.asarray(states[0])), []
        assert int(carry.phase) == 0
        for obs in states:
            action, carry = apply(jnp.asarray(obs), carry)
            actions.append(np.clip(action, -1, 1))
        np.testing.assert_allclose(ep["action"], np.stack(actions), atol=1e-5)
        np.testing.assert_allclose(replay["action"][t:, i], ep["action"], atol=1e-6)
        own = np.clip(apply(jnp.asarray(replay["obs"][0, i]), scripted.init())[0], -1, 1)
        assert np.abs(replay["action"][0, i] - own).max() > 1e-3  # the student drove
