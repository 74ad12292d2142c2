"""Demonstrations from the scripted expert (`vla.collect`): real MJX rollouts and MuJoCo renders.
The module reads the session's small demonstration dataset (`demo_dataset`: the rollout compiles
once, ~30–60 s on 2 CPU cores; a second collect with the same batch size reuses it)."""

import collections
import json

import numpy as np
import pytest

from sim.manipulator import obs_fields
from vla.collect import (
    COLOURS,
    REGIONS,
    STATE_FIELDS,
    TARGETS,
    CollectConfig,
    collect,
    collect_config_from_info,
    episode_length,
    goal_region,
    instruction,
    make_test_dataset,
    rollout_episodes,
)
from vla.dataset import LeRobotDataset

pytestmark = [
    pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning"),  # ffmpeg, EGL probe
    pytest.mark.xdist_group("vla_demo"),  # shares the demo collection and compiled env (-n 2)
]
EPISODES, SIZE = 3, (32, 32)  # the demo_dataset fixture's (tests/vla/conftest.py)


def _layout() -> dict[str, slice]:
    layout, start = {}, 0
    for name, size in obs_fields(4):
        layout[name] = slice(start, start + size)
        start += size
    return layout


L = _layout()


@pytest.fixture(scope="module")
def dataset(demo_dataset):
    return LeRobotDataset(demo_dataset, verify_videos=True)


def test_episodes_succeed_and_match_their_instructions(dataset):
    assert dataset.num_episodes == EPISODES and dataset.fps == 50
    colours = []
    for e in dataset.episodes:
        ep = dataset.episode(e.index)
        meta = e.metadata
        assert meta["success"] is True and ep["next.success"][-1] and ep["next.done"][-1]
        assert not ep["next.done"][:-1].any() and e.length <= 200
        env_state = ep["observation.environment_state"]
        goal = env_state[0, L["goal_pos"]]
        np.testing.assert_allclose(goal, meta["goal"], atol=1e-6)
        region = goal_region(goal[:2], (0.5, 0.0))
        assert meta["goal_region"] == region
        # one of the named targets, `height` above the resting cube: the region names it
        target = TARGETS[REGIONS.index(region)]
        np.testing.assert_allclose(goal[:2], target[:2], atol=1e-6)
        np.testing.assert_allclose(goal[2], target[2] + meta["cube_half_size"], atol=1e-6)
        assert ep["task"] == e.tasks[0] == instruction(meta["colour"], region)
        assert (
            ep["task"] == f"pick up the {meta['colour']} cube and place it on the {region} target"
        )
        colours.append(meta["colour"])
        # the cube ends at the goal: success within the threshold (3 cm)
        cube = env_state[-1, L["cube_pos"]]
        assert np.linalg.norm(cube - goal) < 0.05
        # state = proprioception fields of the actor observation; actions in [-1, 1]
        proprio = np.concatenate([env_state[:, L[f]] for f in STATE_FIELDS], axis=1)
        np.testing.assert_array_equal(ep["observation.state"], proprio)
        assert ep["action"].shape == (e.length, 4) and np.abs(ep["action"]).max() <= 1.0
        np.testing.assert_array_equal(env_state[1:, L["last_action"]], ep["action"][:-1])
        assert ep["observation.images.front"].shape == (e.length, *SIZE, 3)
    assert colours == list(COLOURS)[:EPISODES]  # cycled over the recorded episodes
    info = json.loads((dataset.root / "meta" / "info.json").read_text())
    assert info["hoverfly"]["collect"]["episodes"] == EPISODES
    # the expert's rollouts per goal region; successes only are recorded, all of them
    expert = info["hoverfly"]["expert"]
    recorded = collections.Counter(e.metadata["goal_region"] for e in dataset.episodes)
    assert {r: n["successes"] for r, n in expert.items() if n["successes"]} == recorded
    assert all(n["rollouts"] >= n["successes"] for n in expert.values())
    assert info["features"]["observation.state"]["names"][0] == "joint_pos_0"


def _colour_counts(images: np.ndarray) -> np.ndarray:
    """[4] pixels nearest to each of `COLOURS` (within 60 of 255 per channel distance)."""
    ref = np.array([rgba[:3] for rgba in COLOURS.values()]) * 255
    d = np.linalg.norm(images.reshape(-1, 1, 3).astype(float) - ref, axis=-1)
    return np.bincount(d.argmin(1)[d.min(1) < 60], minlength=len(ref))


def test_cube_is_rendered_in_its_colour(dataset):
    names = list(COLOURS)
    for e in dataset.episodes:
        counts = _colour_counts(dataset.episode(e.index)["observation.images.wrist"])
        assert names[counts.argmax()] == e.metadata["colour"], (e.metadata["colour"], counts)


def test_episode_replays_from_its_reset_seed(dataset):
    """The stored reset seed and the deterministic expert rebuild the recorded episode."""
    cfg = CollectConfig(**{**dataset.info["hoverfly"]["collect"], "image_size": SIZE})
    e = dataset.episodes[1]
    traj = rollout_episodes(cfg, [e.metadata["reset_seed"]])
    ep = dataset.episode(1)
    np.testing.assert_allclose(
        traj["obs"][: e.length, 0], ep["observation.environment_state"], atol=1e-5
    )
    np.testing.assert_allclose(traj["action"][: e.length, 0], ep["action"], atol=1e-5)
    np.testing.assert_array_equal(traj["success"][e.length - 1, 0] > 0, True)


def test_forward_wrist_camera_records_the_same_episodes(dataset, tmp_path):
    """The wrist camera is rendering only: the fixture's seed with the "forward" camera records
    the same episodes, front images and all; only the wrist images change, and the settings
    that rebuild the env for the dataset's policies name the camera."""
    root = make_test_dataset(tmp_path / "fwd", EPISODES, SIZE, seed=0, wrist_camera="forward")
    fwd = LeRobotDataset(root)
    info = fwd.info["hoverfly"]
    assert collect_config_from_info(info).wrist_camera == "forward"
    assert collect_config_from_info(dataset.info["hoverfly"]).wrist_camera == "down"
    for e in dataset.episodes:
        a, b = dataset.episode(e.index), fwd.episode(e.index)
        for key in ("observation.environment_state", "action", "observation.images.front"):
            np.testing.assert_array_equal(a[key], b[key])
        wrist = [x["observation.images.wrist"].astype(int) for x in (a, b)]
        assert np.abs(wrist[0] - wrist[1]).mean() > 10


def test_keep_failures_and_overwrite(dataset, tmp_path):
    with pytest.raises(FileExistsError):
        collect(dataset.root, CollectConfig(episodes=1), progress=False)
    # the same batch size and episode limit as the fixture: the compiled rollout is reused
    root = make_test_dataset(
        tmp_path / "all",
        2,
        (16, 16),
        seed=1,
        keep_failures=True,
        batch_size=EPISODES + 1,
        image_dtype="image",
        colours=("blue",),
    )
    ds = LeRobotDataset(root)
    assert [e.metadata["attempt"] for e in ds.episodes] == [0, 1]
    for e in ds.episodes:
        ep = ds.episode(e.index)
        assert e.metadata["success"] == bool(ep["next.success"][-1])
        assert e.metadata["colour"] == "blue" and ep["observation.images.wrist"].shape[1:] == (
            16,
            16,
            3,
        )


def test_helpers():
    assert goal_region([0.6, 0.02], (0.5, 0.0)) == "front"
    assert goal_region([0.45, 0.01], (0.5, 0.0)) == "back"
    assert goal_region([0.52, 0.1], (0.5, 0.0)) == "left"
    assert goal_region([0.52, -0.1], (0.5, 0.0)) == "right"
    success = np.array([0, 0, 1, 0, 1, 1, 1, 1], float)
    done = np.zeros(8)
    assert episode_length(success, done, hold_steps=2) == 5
    assert episode_length(np.zeros(8), done, hold_steps=2) == 8
    assert episode_length(np.zeros(8), np.eye(8)[3], hold_steps=2) == 4
    with pytest.raises(ValueError, match="task"):
        CollectConfig(task="arm-push").validate()
    with pytest.raises(ValueError, match="colours"):
        CollectConfig(colours=("purple",)).validate()
    with pytest.raises(ValueError, match="even"):
        CollectConfig(image_size=(31, 32)).validate()
