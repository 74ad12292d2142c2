"""LeRobotDataset-layout writer and reader (`vla.dataset`): round trips (mp4 and lossless PNG),
action chunks, a hand-made v2.1 dataset, malformed datasets, atomic writes. Synthetic episodes,
no simulator."""

import json
import os
import shutil

import imageio_ffmpeg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vla.dataset import DatasetError, LeRobotDataset, compute_action_chunks
from vla.dataset_writer import Writer, make_features

os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's encoder: errors only
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ffmpeg under JAX
H, W, FPS = 32, 32, 50
LENGTHS = (12, 20, 7)
TASKS = ("pick up the red cube", "push the blue cube", "pick up the red cube")
CAMERAS = {"front": (H, W), "wrist": (H, W)}
EXTRA = {"next.reward": {"dtype": "float32", "shape": [1], "names": None}}


def _images(t: int, seed: int) -> np.ndarray:
    """[t, H, W, 3] uint8: a smooth background and a square that moves one pixel per frame."""
    rng = np.random.default_rng(seed)
    base = rng.integers(40, 200, 3)
    y, x = np.mgrid[:H, :W]
    out = np.empty((t, H, W, 3), np.uint8)
    for k in range(t):
        out[k] = np.clip(base + x[..., None] * 2 + y[..., None], 0, 255)
        out[k, 8:16, k % 20 : k % 20 + 8] = (220, 40, 40)
    return out


def _episodes() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        {
            "observation.state": rng.normal(size=(t, 5)).astype(np.float32),
            "action": rng.uniform(-1, 1, (t, 4)).astype(np.float32),
            "next.reward": rng.normal(size=t).astype(np.float32),
            "observation.images.front": _images(t, 2 * e),
            "observation.images.wrist": _images(t, 2 * e + 1),
        }
        for e, t in enumerate(LENGTHS)
    ]


EPISODES = _episodes()


def write(root, image_dtype="video", episodes=EPISODES, **kwargs):
    features = make_features(list("abcde"), list("xyzg"), CAMERAS, image_dtype, EXTRA)
    with Writer(root, features, FPS, **kwargs) as writer:
        for e, frames in enumerate(episodes):
            writer.add_episode(frames, TASKS[e], {"success": e != 1, "reset_seed": 100 + e})
    return root


@pytest.fixture(scope="module")
def video_root(tmp_path_factory):
    """A written mp4 dataset; 25 frames per file, so episodes 0 and 1 share files."""
    return write(tmp_path_factory.mktemp("ds") / "video", frames_per_file=25)


@pytest.fixture(scope="module")
def av1_root(tmp_path_factory):
    """The same episodes in AV1 (lerobot's default codec), keyframes every 2 frames."""
    root = tmp_path_factory.mktemp("ds") / "av1"
    return write(root, frames_per_file=25, codec="av1", crf=20, gop=2)


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_round_trip_video(video_root, av1_root, codec):
    ds = LeRobotDataset(video_root if codec == "h264" else av1_root, verify_videos=True)
    assert ds.features["observation.images.front"]["info"]["video.codec"] == codec
    assert len(ds) == sum(LENGTHS) and ds.num_episodes == 3 and ds.fps == FPS
    assert sorted(ds.tasks.values()) == sorted(set(TASKS))
    assert [e.metadata for e in ds.episodes] == [
        {"success": e != 1, "reset_seed": 100 + e} for e in range(3)
    ]
    assert [e.videos["observation.images.front"][1] for e in ds.episodes] == [0, 12, 0]
    for e, frames in enumerate(EPISODES):
        ep = ds.episode(e)
        assert ep["task"] == TASKS[e]
        for key in ("observation.state", "action", "next.reward"):
            np.testing.assert_array_equal(ep[key], frames[key])
            assert ep[key].dtype == np.float32
        np.testing.assert_array_equal(ep["frame_index"], np.arange(LENGTHS[e]))
        np.testing.assert_allclose(ep["timestamp"], np.arange(LENGTHS[e]) / FPS, rtol=1e-6)
        np.testing.assert_array_equal(ep["episode_index"], e)
        for cam in CAMERAS:
            key = f"observation.images.{cam}"
            diff = np.abs(ep[key].astype(int) - frames[key])
            assert ep[key].shape == frames[key].shape and diff.mean() < 4, diff.mean()
            # the right frames (seeking in a file shared by two episodes): the moving square
            # is nearer to its own frame than to the neighbouring ones
            err = [
                np.abs(ep[key][1:-1].astype(int) - frames[key][s : s + LENGTHS[e] - 2])
                for s in (0, 1, 2)
            ]
            assert err[1].mean() < min(err[0].mean(), err[2].mean())
    for cam in CAMERAS:  # each file decoded once: the same frames as episode by episode
        key = f"observation.images.{cam}"
        each = np.concatenate([ds.episode(e)[key] for e in range(3)])
        np.testing.assert_array_equal(ds.camera_frames(key), each)
    item = ds[LENGTHS[0] + 3]  # episode 1, frame 3
    assert item["task"] == TASKS[1] and item["index"] == LENGTHS[0] + 3
    np.testing.assert_array_equal(item["action"], EPISODES[1]["action"][3])
    assert item["observation.images.wrist"].shape == (H, W, 3) and item["frame_index"] == 3
    assert ds[-1]["frame_index"] == LENGTHS[-1] - 1
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_stats_and_info(video_root):
    info = json.loads((video_root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == sum(LENGTHS)
    assert info["features"]["observation.images.front"]["dtype"] == "video"
    assert info["features"]["action"]["names"] == list("xyzg")
    stats = LeRobotDataset(video_root).stats
    state = np.concatenate([f["observation.state"] for f in EPISODES]).astype(np.float64)
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats["observation.state"]["std"], state.std(0), rtol=1e-9)
    np.testing.assert_array_equal(stats["observation.state"]["min"], state.min(0))
    np.testing.assert_array_equal(stats["observation.state"]["max"], state.max(0))
    assert stats["observation.state"]["count"].tolist() == [sum(LENGTHS)]
    front = np.concatenate([f["observation.images.front"] for f in EPISODES]) / 255.0
    assert stats["observation.images.front"]["mean"].shape == (3, 1, 1)
    np.testing.assert_allclose(
        stats["observation.images.front"]["mean"][:, 0, 0], front.reshape(-1, 3).mean(0)
    )


def test_round_trip_png_is_exact(tmp_path):
    ds = LeRobotDataset(write(tmp_path / "png", image_dtype="image"), as_tensors=True)
    assert not list(tmp_path.glob("png/videos"))
    for e, frames in enumerate(EPISODES):
        ep = ds.episode(e)
        for cam in CAMERAS:
            key = f"observation.images.{cam}"
            np.testing.assert_array_equal(ep[key], frames[key])
    for cam in CAMERAS:  # the whole camera, one key decoded
        key = f"observation.images.{cam}"
        whole = np.concatenate([frames[key] for frames in EPISODES])
        np.testing.assert_array_equal(ds.camera_frames(key), whole)
    item = ds[2]  # torch: images float [3, H, W] in [0, 1]
    assert tuple(item["observation.images.front"].shape) == (3, H, W)
    np.testing.assert_allclose(
        item["observation.images.front"].numpy(),
        EPISODES[0]["observation.images.front"][2].transpose(2, 0, 1) / 255.0,
        atol=1e-6,
    )
    assert item["task"] == TASKS[0] and tuple(item["action"].shape) == (4,)


def test_undecodable_png_names_file_and_field(tmp_path):
    root = write(tmp_path / "png", image_dtype="image")
    path = root / "data/chunk-000/file-000.parquet"
    key = "observation.images.wrist"

    def corrupt(table):
        rows = table[key].to_pylist()
        rows[3] = {"bytes": rows[3]["bytes"][:20], "path": None}  # a truncated PNG
        return table.set_column(table.schema.get_field_index(key), key, pa.array(rows))

    _edit_parquet(path, corrupt)
    ds = LeRobotDataset(root)
    with pytest.raises(DatasetError, match=f"file-000.parquet: {key}: frame 3: not an image"):
        ds.episode(0)


def test_action_chunks(video_root):
    actions = np.arange(10.0).reshape(5, 2)
    chunks, pad = compute_action_chunks(actions, 3)
    assert chunks.shape == (5, 3, 2) and pad.shape == (5, 3)
    np.testing.assert_array_equal(chunks[1], actions[1:4])
    np.testing.assert_array_equal(chunks[3], actions[[3, 4, 4]])
    np.testing.assert_array_equal(pad[3], [False, False, True])
    np.testing.assert_array_equal(pad[4], [False, True, True])
    ds = LeRobotDataset(video_root, action_horizon=4)
    last = LENGTHS[0] - 2  # two actions left in episode 0: no spill into episode 1
    item = ds[last]
    a0 = EPISODES[0]["action"]
    np.testing.assert_array_equal(item["action"], a0[[-2, -1, -1, -1]])
    np.testing.assert_array_equal(item["action_is_pad"], [False, False, True, True])
    chunks, pad = compute_action_chunks(a0, 4)
    for t in range(LENGTHS[0]):
        a, p = ds.action_chunk(t, 4)
        np.testing.assert_array_equal(a, chunks[t])
        np.testing.assert_array_equal(p, pad[t])


def _write_v21(root):
    """A v2.1 dataset by hand: per-episode parquet (list columns), mp4s, jsonl metadata."""
    (root / "meta").mkdir(parents=True)
    features = make_features(list("abcde"), list("xyzg"), {"front": (H, W)}, "video", EXTRA)
    features |= {
        k: {"dtype": d, "shape": [1], "names": None}
        for k, d in [
            ("timestamp", "float32"),
            ("frame_index", "int64"),
            ("episode_index", "int64"),
            ("index", "int64"),
            ("task_index", "int64"),
        ]
    }
    info = {
        "codebase_version": "v2.1",
        "robot_type": "test",
        "total_episodes": 2,
        "total_frames": LENGTHS[0] + LENGTHS[1],
        "total_tasks": 2,
        "total_videos": 2,
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": "0:2"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": (
            "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        ),
        "features": features,
    }
    (root / "meta" / "info.json").write_text(json.dumps(info))
    tasks = [{"task_index": 0, "task": TASKS[1]}, {"task_index": 1, "task": TASKS[0]}]
    (root / "meta" / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in tasks))
    episodes = [{"episode_index": e, "tasks": [TASKS[e]], "length": LENGTHS[e]} for e in (0, 1)]
    (root / "meta" / "episodes.jsonl").write_text("\n".join(json.dumps(e) for e in episodes))
    start = 0
    for e in (0, 1):
        frames, t = EPISODES[e], LENGTHS[e]
        table = pa.table(
            {
                "observation.state": pa.array(frames["observation.state"].tolist()),
                "action": pa.array(frames["action"].tolist(), pa.list_(pa.float32())),
                "next.reward": frames["next.reward"],
                "timestamp": (np.arange(t) / FPS).astype(np.float32),
                "frame_index": np.arange(t),
                "episode_index": np.full(t, e),
                "index": start + np.arange(t),
                "task_index": np.full(t, 1 - e),
            }
        )
        path = root / "data" / "chunk-000" / f"episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        video = root / "videos" / "chunk-000" / "observation.images.front" / f"episode_{e:06d}.mp4"
        _mp4(video, frames["observation.images.front"])
        start += t
    return root


def _mp4(path, images):
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = imageio_ffmpeg.write_frames(
        str(path),
        (W, H),
        fps=FPS,
        codec="libx264",
        quality=None,
        macro_block_size=1,
        ffmpeg_log_level="error",
        output_params=["-crf", "18"],
    )
    gen.send(None)
    for image in images:
        gen.send(np.ascontiguousarray(image).tobytes())
    gen.close()


def test_reads_v21_layout(tmp_path):
    ds = LeRobotDataset(_write_v21(tmp_path / "v21"), verify_videos=True, action_horizon=2)
    assert ds.version == "v2.1" and len(ds) == LENGTHS[0] + LENGTHS[1]
    for e in (0, 1):
        ep = ds.episode(e)
        assert ep["task"] == TASKS[e] and ds.episodes[e].tasks == (TASKS[e],)
        np.testing.assert_array_equal(ep["observation.state"], EPISODES[e]["observation.state"])
        np.testing.assert_array_equal(ep["action"], EPISODES[e]["action"])
        diff = np.abs(
            ep["observation.images.front"].astype(int) - EPISODES[e]["observation.images.front"]
        )
        assert diff.mean() < 4
    item = ds[LENGTHS[0] - 1]
    np.testing.assert_array_equal(item["action_is_pad"], [False, True])
    assert ds.stats == {}


def test_torch_data_loader(video_root):
    import torch

    ds = LeRobotDataset(video_root, action_horizon=5, as_tensors=True)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    batch = next(iter(loader))
    assert tuple(batch["observation.images.wrist"].shape) == (4, 3, H, W)
    assert tuple(batch["action"].shape) == (4, 5, 4) and batch["action_is_pad"].dtype == torch.bool
    assert tuple(batch["next.reward"].shape) == (4,) and len(batch["task"]) == 4


# -- malformed datasets ------------------------------------------------------------------------
def _edit_json(path, fn):
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def _edit_parquet(path, fn):
    pq.write_table(fn(pq.read_table(path)), path)


def _short_video(root):
    path = root / "videos/observation.images.front/chunk-000/file-001.mp4"
    _mp4(path, EPISODES[2]["observation.images.front"][:-2])


def _gap(root):
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    _edit_parquet(path, lambda t: t.set_column(0, "episode_index", pa.array([0, 1, 3])))


INFO = "meta/info.json"


def _reshape(key, shape):
    """A corruption: info.json gives feature `key` another shape."""

    def edit(info):
        return info | {
            "features": info["features"] | {key: info["features"][key] | {"shape": shape}}
        }

    return lambda root: _edit_json(root / INFO, edit)


MALFORMED = {
    "missing info": (lambda r: (r / INFO).unlink(), "info.json: file: missing"),
    "bad json": (lambda r: (r / INFO).write_text('{"fps": 50,'), "info.json: JSON: invalid"),
    "version": (
        lambda r: _edit_json(r / INFO, lambda i: i | {"codebase_version": "v1.6"}),
        "info.json: codebase_version: 'v1.6' unsupported",
    ),
    "no fps": (
        lambda r: _edit_json(r / INFO, lambda i: {k: v for k, v in i.items() if k != "fps"}),
        "info.json: fps: missing",
    ),
    "missing column": (
        lambda r: _edit_parquet(
            r / "data/chunk-000/file-001.parquet", lambda t: t.drop(["action"])
        ),
        "data/chunk-000/file-001.parquet: action: column missing",
    ),
    "wrong shape": (
        _reshape("action", [3]),
        r"data/chunk-000/file-000.parquet: action: rows of length \[4\], feature shape \[3\]",
    ),
    "image size": (
        _reshape("observation.images.wrist", [30, 32, 3]),
        r"chunk-000/file-000.mp4: observation.images.wrist: frames of \(32, 32\) px",
    ),
    "total frames": (
        lambda r: _edit_json(r / INFO, lambda i: i | {"total_frames": 40}),
        "info.json: total_frames: 40",
    ),
    "episode gap": (_gap, "episodes/chunk-000/file-000.parquet: episode_index: .*3 where 2"),
    "rows mismatch": (
        lambda r: _edit_parquet(r / "data/chunk-000/file-001.parquet", lambda t: t.slice(0, 5)),
        "file-001.parquet: episode_index: episode 2 has 5 rows, .* length 7",
    ),
    "missing tasks": (
        lambda r: (r / "meta/tasks.parquet").unlink(),
        "tasks.parquet: file: missing",
    ),
    "short video": (
        _short_video,
        "observation.images.front/chunk-000/file-001.mp4: observation.images.front: 5 frames",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_dataset_names_file_and_field(video_root, tmp_path, case):
    root = tmp_path / "ds"
    shutil.copytree(video_root, root)
    corrupt, message = MALFORMED[case]
    corrupt(root)
    with pytest.raises(DatasetError, match=message):
        LeRobotDataset(root, verify_videos=True)
    if case == "short video":  # found lazily too, when the episode is decoded
        ds = LeRobotDataset(root)
        with pytest.raises(DatasetError, match="file-001.mp4: observation.images.front: 5 frames"):
            ds.episode(2)
        with pytest.raises(DatasetError, match="file-001.mp4: observation.images.front: 5 frames"):
            ds.camera_frames("observation.images.front")


# -- atomic writes -----------------------------------------------------------------------------
def test_failed_write_leaves_nothing(tmp_path):
    root = tmp_path / "out"
    with pytest.raises(RuntimeError, match="mid-write"):
        with Writer(root, make_features(["a"], ["x"], {"front": (H, W)}), FPS) as writer:
            frames = {
                "observation.state": np.zeros((3, 1), np.float32),
                "action": np.zeros((3, 1), np.float32),
                "observation.images.front": _images(3, 0),
            }
            writer.add_episode(frames, "task")
            assert writer.tmp.name.startswith("out.tmp-") and (writer.tmp / "videos").is_dir()
            raise RuntimeError("mid-write")
    assert list(tmp_path.iterdir()) == []
    # a bad episode raises before anything of it is written; the with block then cleans up
    with pytest.raises(ValueError, match="non-finite"):
        with Writer(root, make_features(["a"], ["x"], {}), FPS) as writer:
            bad = {"observation.state": np.full((2, 1), np.nan), "action": np.zeros((2, 1))}
            writer.add_episode(bad, "task")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_is_refused_unless_asked(video_root, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(video_root, root)
    with pytest.raises(FileExistsError, match="not empty"):
        Writer(root, make_features(["a"], ["x"], {}), FPS)
    one = [{k: v for k, v in EPISODES[2].items()}]
    write(root, episodes=one, overwrite=True)
    ds = LeRobotDataset(root)
    assert ds.num_episodes == 1 and len(ds) == LENGTHS[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_writer_checks_episodes(tmp_path):
    features = make_features(["a", "b"], ["x"], {"front": (H, W)})
    with Writer(tmp_path / "x", features, FPS) as writer:
        ok = {
            "observation.state": np.zeros((2, 2)),
            "action": np.zeros((2, 1)),
            "observation.images.front": _images(2, 0),
        }
        with pytest.raises(ValueError, match="missing \\['action'\\]"):
            writer.add_episode({k: v for k, v in ok.items() if k != "action"}, "t")
        with pytest.raises(ValueError, match="observation.state: frames of shape \\(3,\\)"):
            writer.add_episode(ok | {"observation.state": np.zeros((2, 3))}, "t")
        with pytest.raises(ValueError, match="uint8"):
            writer.add_episode(ok | {"observation.images.front": _images(2, 0) / 1.0}, "t")
        with pytest.raises(ValueError, match="common length"):
            writer.add_episode(ok | {"action": np.zeros((3, 1))}, "t")
        writer.add_episode(ok, "t", {"seed": 1})
        with pytest.raises(ValueError, match="metadata keys"):
            writer.add_episode(ok, "t", {"other": 1})
    assert LeRobotDataset(tmp_path / "x").num_episodes == 1
