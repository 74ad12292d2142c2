"""RL post-training of the compact VLA (`vla.rl`): hand-computed GAE / GRPO / clipped-loss oracles,
the cutting of successful episodes into frames, and short PPO, GRPO (+ RL-Co anchor) and RFT runs
in the MJX arm env that resume after a kill."""

import csv
import dataclasses
import math

import numpy as np
import pytest
import torch

from vla.checkpoint import load_checkpoint, load_train_state
from vla.collect import FAST_COMPILE
from vla.configuration_rl import RLConfig
from vla.configuration_sft import SFTConfig
from vla.frames import gather_batch
from vla.rft import Replay, imitate, success_frames
from vla.rl import (
    _Rollout,
    _rollout,
    _Run,
    _score,
    compute_gae,
    compute_group_advantages,
    compute_policy_loss,
    train_rl,
)
from vla.sft import train_sft

pytestmark = [
    pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning"),  # ffmpeg, EGL probe
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.xdist_group("vla_demo"),  # shares the demo collection and compiled env (-n 2)
]


# -- oracles ---------------------------------------------------------------------------------------
def test_gae_matches_a_hand_computation():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0], [0.5, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.4, 0.5, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    g, lam = 0.9, 0.8
    adv, ret = compute_gae(rewards, values, mask, g, lam)
    # episode 0 ends at t = 2 (no bootstrap), episode 1 at t = 1
    d2 = 1.0 - 0.3
    d1 = 0.0 + g * 0.3 - 0.2
    d0 = 0.0 + g * 0.2 - 0.1
    a0 = [d0 + g * lam * (d1 + g * lam * d2), d1 + g * lam * d2, d2, 0.0]
    e1 = 0.0 - 0.5
    e0 = 0.5 + g * 0.5 - 0.4
    a1 = [e0 + g * lam * e1, e1, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor([a0, a1]))
    torch.testing.assert_close(ret, (torch.tensor([a0, a1]) + values) * mask)


def test_group_advantages_and_dynamic_sampling():
    outcomes = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv, keep = compute_group_advantages(outcomes, 4)
    # group 0: mean 0.25, population std sqrt(3) / 4
    std = math.sqrt(3) / 4
    expected = [(1 - 0.25) / std] + [-0.25 / std] * 3 + [0.0] * 4
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-5, rtol=1e-5)
    assert keep.tolist() == [True] * 4 + [False] * 4  # all succeeded: no signal
    _, keep_all = compute_group_advantages(outcomes, 4, drop_uniform=False)
    assert keep_all.all()


def test_clipped_loss_and_kl():
    adv = torch.tensor([1.0, -1.0, 2.0])
    same = torch.tensor([-3.0, -4.0, -5.0])
    loss, stats = compute_policy_loss(same, same, adv, 0.2, 0.28)
    assert float(loss) == pytest.approx(-float(adv.mean()))
    assert float(stats["approx_kl"]) == 0.0 and float(stats["clip_frac"]) == 0.0
    # ratio e^1 with A > 0 is clipped at 1.28 (clip-higher); ratio e^-1 with A < 0 at 0.8
    logp = same + torch.tensor([1.0, -1.0, 0.0])
    loss, stats = compute_policy_loss(logp, same, adv, 0.2, 0.28)
    assert float(loss) == pytest.approx(-(1.28 * 1.0 + 0.8 * -1.0 + 2.0) / 3, rel=1e-6)
    assert float(stats["clip_frac"]) == pytest.approx(2 / 3)
    k3 = ((math.e - 1 - 1) + (math.exp(-1) - 1 + 1)) / 3
    assert float(stats["approx_kl"]) == pytest.approx(k3, rel=1e-6)
    # S ratio terms per chunk are clipped one by one, each with its chunk's advantage
    logp2 = torch.stack([same, logp], 1)
    loss2, stats2 = compute_policy_loss(logp2, torch.stack([same, same], 1), adv, 0.2, 0.28)
    assert float(loss2) == pytest.approx((-float(adv.mean()) + float(loss)) / 2, rel=1e-6)
    assert float(stats2["clip_frac"]) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("field", "value"),
    [("init", ""), ("algo", "a2c"), ("iterations", 0), ("clip_low", 1.5), ("sft_coef", 1.0)],
)
def test_validate_names_the_field(field, value):
    with pytest.raises(ValueError, match=field.split("_coef")[0]):
        RLConfig(**({"init": "x"} | {field: value})).validate()
    with pytest.raises(ValueError, match="group_size"):
        RLConfig(init="x", algo="grpo", num_envs=6, group_size=4).validate()
    with pytest.raises(ValueError, match="group_size"):
        RLConfig(init="x", algo="rft", num_envs=6, group_size=4).validate()
    RLConfig(init="x", algo="rft", num_envs=6, group_size=1).validate()


# -- runs in the simulator -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, demo_dataset):
    root = tmp_path_factory.mktemp("rl")
    cfg = SFTConfig(
        data=(str(demo_dataset),), out=str(root / "sft"), preset="test", steps=2, batch_size=8,
        warmup_steps=1, checkpoint_every=2, eval_episodes=0,
    )  # fmt: skip
    train_sft(cfg, progress=False)
    return root


def _cfg(root, out, **kw) -> RLConfig:
    base = {
        "init": str(root / "sft"),
        "out": str(out),
        "iterations": 2,
        "num_envs": 4,
        "max_steps": 12,
        "epochs": 1,
        "minibatch_size": 8,
        "value_warmup_iterations": 1,
        "eval_every": 0,
        "eval_episodes": 4,  # = num_envs: one compiled env step for rollouts and evaluations
        "target_kl": None,
        "lr": 1e-3,
    }
    return RLConfig(**(base | kw))


def _rows(path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _learning(rows) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows]


@pytest.mark.parametrize("ratio", ["flow_noise", "fpo"])
def test_rollout_scores_are_recomputed_exactly(sft_run, ratio):
    model, processor = load_checkpoint(sorted((sft_run / "sft" / "checkpoints").iterdir())[-1])
    import json

    ckpt = sorted((sft_run / "sft" / "checkpoints").iterdir())[-1]
    env_info = json.loads(load_train_state(ckpt)["env_info"])
    opts = tuple(FAST_COMPILE.items())
    ro = _rollout(model.eval(), processor, env_info, 4, 2, 7, 8, 0.0, opts, ratio, 3)
    c = model.config
    terms = c.num_flow_steps if ratio == "flow_noise" else 3
    assert ro.logp.shape == (4, 2, terms) and ro.mask.shape == (4, 2)
    assert ro.texts[0] == ro.texts[1] and ro.texts[2] == ro.texts[3]  # groups share a reset
    np.testing.assert_array_equal(ro.proprio[0, 0], ro.proprio[1, 0])
    w = ro.images.shape[3] // 2
    batch = {
        k: v
        for k, v in processor(
            {"front": ro.images[:, 0, :, :w], "wrist": ro.images[:, 0, :, w:]},
            ro.proprio[:, 0],
            ro.texts,
        ).items()
    }
    record = {name: v[:, 0] for name, v in ro.sample.items()}
    with torch.no_grad():
        logp = _score(model, batch, record)
    torch.testing.assert_close(logp, ro.logp[:, 0], atol=1e-3, rtol=1e-5)
    chunk = record["trajectory"][:, -1] if ratio == "flow_noise" else record["actions"]
    assert chunk.shape == (4, c.chunk_size, c.action_dim)
    assert not torch.equal(chunk[0], chunk[1])  # independent noise


def test_ppo_run_logs_evaluates_and_resumes_after_a_kill(sft_run, tmp_path):
    opts = FAST_COMPILE
    final = train_rl(_cfg(sft_run, tmp_path / "full"), progress=False, compiler_options=opts)
    assert final.name == "iter_000002"
    rows = _rows(tmp_path / "full" / "metrics.csv")
    assert [r["iteration"] for r in rows] == ["1", "2"]
    assert float(rows[0]["policy_loss"]) == 0.0  # critic warm-up: value head only
    assert float(rows[1]["approx_kl"]) >= 0 and float(rows[1]["value_loss"]) > 0
    assert all(int(r["chunks"]) >= 4 and float(r["entropy"]) < 0 for r in rows)
    assert [r["iteration"] for r in _rows(tmp_path / "full" / "eval.csv")] == ["0", "2"]
    assert (tmp_path / "full" / "learning_curve.png").stat().st_size > 1000
    assert load_train_state(final)["iteration"] == 2

    def kill(it, _):
        if it == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_rl(_cfg(sft_run, tmp_path / "killed"), False, kill, opts)
    train_rl(_cfg(sft_run, tmp_path / "killed"), progress=False, compiler_options=opts)
    assert _learning(_rows(tmp_path / "killed" / "metrics.csv")) == _learning(rows)
    a, _ = load_checkpoint(final)
    b, _ = load_checkpoint(tmp_path / "killed" / "checkpoints" / "iter_000002")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    with pytest.raises(ValueError, match="lr"):
        train_rl(_cfg(sft_run, tmp_path / "killed", lr=1.0), progress=False)


def test_grpo_fpo_with_sft_anchor(sft_run, demo_dataset, tmp_path):
    cfg = _cfg(
        sft_run,
        tmp_path / "grpo",
        algo="grpo",
        ratio="fpo",
        fpo_draws=2,
        group_size=2,
        iterations=1,
        dynamic_sampling=False,
        sft_coef=0.5,
        sft_data=str(demo_dataset),
    )
    train_rl(cfg, progress=False, compiler_options=FAST_COMPILE)
    (row,) = _rows(tmp_path / "grpo" / "metrics.csv")
    assert float(row["sft_loss"]) > 0 and float(row["value_loss"]) == 0.0
    assert int(row["updates"]) >= 1 and float(row["groups_kept"]) == 1.0
    assert float(row["approx_kl"]) > 0 and math.isnan(float(row["entropy"]))


def _fake_rollout(success, lengths, steps=7, k=2, a=3) -> _Rollout:
    b, t = len(success), -(-steps // k)
    images = np.arange(b * t, dtype=np.uint8).reshape(b, t, 1, 1, 1) * np.ones(
        (1, 1, 4, 8, 3), np.uint8
    )
    return _Rollout(
        images=images,
        proprio=np.arange(b * t * 2, dtype=np.float32).reshape(b, t, 2),
        texts=[f"episode {i}" for i in range(b)],
        sample={}, logp=torch.zeros(b, t, 1), value=torch.zeros(b, t),
        reward=torch.zeros(b, t), mask=torch.ones(b, t),
        actions=np.arange(b * steps * a, dtype=np.float32).reshape(b, steps, a),
        lengths=np.asarray(lengths), success=np.asarray(success), env_steps=int(sum(lengths)),
        seconds={},
    )  # fmt: skip


def test_success_frames_cut_the_executed_actions_of_successful_episodes():
    ro = _fake_rollout([True, False, True], [5, 7, 7])
    f = success_frames(ro, chunk_size=4, k=2)
    assert len(f["states"]) == 3 + 4  # chunk starts 0, 2, 4 and 0, 2, 4, 6
    assert list(f["texts"]) == ["episode 0"] * 3 + ["episode 2"] * 4
    np.testing.assert_array_equal(f["images"][:3, 0, 0, 0], ro.images[0, :3, 0, 0, 0])
    np.testing.assert_array_equal(f["states"][3:], ro.proprio[2])
    # episode 0 ends after 5 steps: the frame at step 4 holds action 4, then its last one padded
    np.testing.assert_array_equal(f["chunks"][2], ro.actions[0, [4, 4, 4, 4]])
    np.testing.assert_array_equal(f["is_pad"][2], [False, True, True, True])
    np.testing.assert_array_equal(f["chunks"][4], ro.actions[2, 2:6])
    assert not f["is_pad"][4].any()
    kept = success_frames(ro, chunk_size=4, k=2, keep=np.array([False, True, True]))
    assert list(kept["texts"]) == ["episode 2"] * 4
    empty = success_frames(_fake_rollout([False], [7]), chunk_size=4, k=2)
    assert empty["chunks"].shape == (0, 4, 3) and empty["images"].shape == (0, 4, 8, 3)


def _demo_part(run: _Run, demo_dataset) -> dict[str, np.ndarray]:
    """16 frames of the scripted demonstrations as a replay part (they stand in for successes,
    which a 2-step SFT model does not have)."""
    from vla.dataset import LeRobotDataset
    from vla.frames import load_frames

    frames = load_frames([LeRobotDataset(demo_dataset)], run.model.config, torch.device("cpu"))
    idx = np.arange(0, len(frames.states), 9)[:16]
    return {
        "images": np.concatenate([frames.images[c][idx].numpy() for c in ("front", "wrist")], 2),
        "states": frames.states[idx],
        "chunks": frames.chunks[idx],
        "is_pad": frames.is_pad[idx],
        "texts": np.array([frames.tasks[i] for i in frames.task[idx]]),
    }


def test_replay_grows_in_place_and_holds_every_part_in_order():
    parts = [
        success_frames(_fake_rollout(ok, [7] * len(ok)), chunk_size=4, k=2)
        for ok in ([True], [False, True, True], [False], [True, True, True, True, True])
    ]
    for p in parts:  # each column its own value: the cameras are told apart
        p["images"] = p["images"] + np.arange(8, dtype=np.uint8)[None, None, :, None]
    replay = Replay(("front", "wrist"), torch.device("cpu"))
    for p in parts:
        replay.append(p)
    assert len(replay) == 4 * (1 + 2 + 0 + 5)
    f = replay.frames()
    np.testing.assert_array_equal(f.states, np.concatenate([p["states"] for p in parts]))
    np.testing.assert_array_equal(f.chunks, np.concatenate([p["chunks"] for p in parts]))
    np.testing.assert_array_equal(f.is_pad, np.concatenate([p["is_pad"] for p in parts]))
    texts = np.concatenate([p["texts"] for p in parts])
    assert [f.tasks[i] for i in f.task] == list(texts)
    images = np.concatenate([p["images"] for p in parts])
    np.testing.assert_array_equal(f.images["front"].numpy(), images[:, :, :4])
    np.testing.assert_array_equal(f.images["wrist"].numpy(), images[:, :, 4:])


def test_rft_imitates_its_replay(sft_run, demo_dataset, tmp_path):
    """The M-step lowers the flow-matching loss of the replayed frames."""
    run = _Run.create(_cfg(sft_run, tmp_path / "rft", algo="rft", epochs=4, group_size=2))
    run.replay.append(_demo_part(run, demo_dataset))

    def loss() -> float:  # on all 16 frames, the same noise and times every time
        batch = gather_batch(run.replay.frames(), run.processor, np.arange(16), torch.device("cpu"))
        with torch.no_grad():
            return float(run.model.flow_matching_loss(batch, torch.Generator().manual_seed(0)))

    before = loss()
    assert imitate(run, 16, seed=0)["updates"] == 8  # ⌈4 · 16 / 8⌉
    for seed in range(1, 12):
        imitate(run, 16, seed)
    assert loss() < 0.8 * before  # 1.81 → 1.11 when written
    assert imitate(run, 0, seed=9)["updates"] == 0


def test_ema_averages_every_step_and_is_what_checkpoints_hold(sft_run, demo_dataset, tmp_path):
    d = 0.75
    cfg = _cfg(sft_run, tmp_path / "ema", algo="rft", epochs=1, group_size=2, ema_decay=d)
    run = _Run.create(cfg)
    run.replay.append(_demo_part(run, demo_dataset))
    start = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    assert run.policy is run.ema
    assert imitate(run, 8, seed=0)["updates"] == 1  # ⌈8 / 8⌉
    avg, trained = dict(run.ema.named_parameters()), dict(run.model.named_parameters())
    moved = 0
    for n, p0 in start.items():  # one step from equal weights: p̄ = p0 + (1 − d)(p − p0)
        torch.testing.assert_close(avg[n], p0 + (1 - d) * (trained[n] - p0))
        moved += not torch.equal(trained[n], p0)
    assert moved > 10
    imitate(run, 16, seed=1)
    path = run.save()
    saved, _ = load_checkpoint(path)
    for n, p in saved.named_parameters():
        assert torch.equal(p, avg[n]), n
    resumed = _Run.create(cfg)
    resumed.resume(path)
    for n, p in resumed.model.named_parameters():
        assert torch.equal(p, trained[n]), n
    for n, p in resumed.ema.named_parameters():
        assert torch.equal(p, avg[n]), n
    with pytest.raises(ValueError, match="ema_decay"):
        dataclasses.replace(cfg, ema_decay=1.0).validate()


def test_rft_run_writes_its_replay_and_resumes_after_a_kill(sft_run, tmp_path):
    cfg = _cfg(sft_run, tmp_path / "full", algo="rft", ratio="fpo", fpo_draws=1, group_size=1)
    train_rl(cfg, progress=False, compiler_options=FAST_COMPILE)
    rows = _rows(tmp_path / "full" / "metrics.csv")
    for i, row in enumerate(rows, 1):
        with np.load(tmp_path / "full" / "replay" / f"iter_{i:06d}.npz") as z:
            assert len(z["states"]) == len(z["chunks"]) == len(z["texts"])
            n = len(z["states"])
        assert (n > 0) == (float(row["train_success"]) > 0)
    assert math.isnan(float(rows[0]["approx_kl"])) and float(rows[0]["value_loss"]) == 0.0

    def kill(it, _):
        if it == 2:
            raise KeyboardInterrupt

    killed = dataclasses.replace(cfg, out=str(tmp_path / "killed"))
    with pytest.raises(KeyboardInterrupt):
        train_rl(killed, False, kill, FAST_COMPILE)
    train_rl(killed, progress=False, compiler_options=FAST_COMPILE)
    assert _learning(_rows(tmp_path / "killed" / "metrics.csv")) == _learning(rows)
    (tmp_path / "killed" / "replay" / "iter_000001.npz").unlink()
    with pytest.raises(FileNotFoundError, match="iter_000001.npz"):
        train_rl(dataclasses.replace(killed, iterations=3), progress=False)
