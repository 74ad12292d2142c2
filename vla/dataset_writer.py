"""Writes demonstration datasets in lerobot's `LeRobotDataset` v3.0 layout (described, and read
back, in `vla.dataset`): `Writer` episode by episode, atomically; `make_features` builds the
features dict. Per-feature statistics (meta/stats.json) are accumulated while writing; image
statistics are per channel over pixels scaled to [0, 1], shape [3, 1, 1] (lerobot's convention).
"""

from __future__ import annotations

import collections
import io
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vla.dataset import _EPISODE_COLUMNS, _EPISODE_PREFIXES, NUMERIC, VISUAL, map_threads

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
"""Per-frame bookkeeping columns the writer fills in itself."""


def make_features(
    state_names: Sequence[str],
    action_names: Sequence[str],
    cameras: Mapping[str, tuple[int, int]],
    image_dtype: str = "video",
    extra: Mapping[str, dict] | None = None,
) -> dict[str, dict]:
    """A lerobot `features` dict: `observation.state` [S] float32, `action` [A] float32, one
    `observation.images.<camera>` [H, W, 3] per camera ((H, W) in `cameras`, px) of `image_dtype`
    ("video" or "image"), plus `extra` features ({key: {dtype, shape, names}})."""
    if image_dtype not in VISUAL:
        raise ValueError(f"image_dtype must be one of {VISUAL}, not {image_dtype!r}")
    hwc = ["height", "width", "channels"]
    features = {
        "observation.state": {
            "dtype": "float32",
            "shape": [len(state_names)],
            "names": list(state_names),
        },
        "action": {"dtype": "float32", "shape": [len(action_names)], "names": list(action_names)},
    }
    for name, (h, w) in cameras.items():
        image = {"dtype": image_dtype, "shape": [int(h), int(w), 3], "names": hwc}
        features[f"observation.images.{name}"] = image
    return features | dict(extra or {})


# -- statistics ------------------------------------------------------------------------------
class _Stats:
    """Running mean/variance (Chan's parallel merge), min and max over axis 0 of batches."""

    def __init__(self):
        self.n, self.mean, self.m2, self.min, self.max = 0, 0.0, 0.0, None, None

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64)
        n, mean = len(x), x.mean(0)
        m2 = ((x - mean) ** 2).sum(0)
        total = self.n + n
        delta = mean - self.mean
        self.m2 = self.m2 + m2 + delta**2 * self.n * n / total
        self.mean = self.mean + delta * n / total
        self.n = total
        lo, hi = x.min(0), x.max(0)
        self.min = lo if self.min is None else np.minimum(self.min, lo)
        self.max = hi if self.max is None else np.maximum(self.max, hi)

    def as_dict(self, shape: tuple[int, ...]) -> dict[str, list]:
        std = np.sqrt(np.maximum(self.m2 / max(self.n, 1), 0.0))
        out = {"mean": self.mean, "std": std, "min": self.min, "max": self.max}
        out = {k: np.asarray(v, np.float64).reshape(shape).tolist() for k, v in out.items()}
        return out | {"count": [self.n]}


# -- writer ----------------------------------------------------------------------------------
class Writer:
    """Writes a v3.0 dataset episode by episode into `OUT.tmp-<random>` beside `root` and renames
    it to `root` in `finalize()`, so `root` is either absent or complete.

    features: lerobot features ({key: {"dtype", "shape", "names"}}, e.g. from `make_features`);
    the bookkeeping columns (`DEFAULT_FEATURES`) are added. fps: frames per second (int).
    overwrite: replace an existing non-empty `root` (else `FileExistsError`, raised here).
    frames_per_file: start new data/video files once a file holds this many frames.
    codec: "h264" (libx264) or "av1" (libsvtav1, lerobot's default); crf, pix_fmt, gop: quality
    (lower is better: 0 … 51 for H.264, … 63 for AV1), pixel format and keyframe interval.
    info: extra JSON-serializable entries for meta/info.json (e.g. how the data was made); kept
    as the `info` attribute, which may be added to until `finalize()` writes it.

    Use as a context manager: a clean exit finalizes, an exception removes the temporary folder.
    """

    def __init__(
        self,
        root: str | Path,
        features: Mapping[str, dict],
        fps: int,
        robot_type: str | None = None,
        overwrite: bool = False,
        frames_per_file: int = 50_000,
        chunks_size: int = 1000,
        codec: str = "h264",
        crf: int = 18,
        pix_fmt: str = "yuv420p",
        gop: int = 10,
        info: Mapping[str, Any] | None = None,
    ):
        self.root = Path(root)
        if self.root.exists() and (not self.root.is_dir() or any(self.root.iterdir())):
            if not overwrite:
                raise FileExistsError(f"{self.root} exists and is not empty (pass overwrite=True)")
        self.features = {k: _normalize_feature(k, v) for k, v in features.items()}
        self.features |= {k: dict(v) for k, v in DEFAULT_FEATURES.items()}
        odd = [k for k, f in self.features.items() if f["dtype"] == "video" and f["shape"][0] % 2]
        odd += [k for k, f in self.features.items() if f["dtype"] == "video" and f["shape"][1] % 2]
        if odd and pix_fmt == "yuv420p":
            raise ValueError(f"{odd}: yuv420p video needs an even height and width")
        self.fps, self.robot_type = int(fps), robot_type
        self.frames_per_file, self.chunks_size = frames_per_file, chunks_size
        if codec not in _ENCODERS:
            raise ValueError(f"codec must be one of {list(_ENCODERS)}, not {codec!r}")
        self._video_options = (codec, crf, pix_fmt, gop)
        self.info = dict(info or {})
        json.dumps(self.info)  # fail early, not at finalize
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.root.name}.tmp-", dir=self.root.parent))
        self._tasks: dict[str, int] = {}
        self._episodes: list[dict] = []
        self._stats = {k: _Stats() for k, ft in self.features.items() if ft["dtype"] != "string"}
        self._rows: dict[str, list] = collections.defaultdict(list)
        self._videos: dict[str, Any] = {}
        self._file_no, self._file_frames, self._frames = 0, 0, 0
        self._meta_keys: tuple[str, ...] | None = None
        self._done = False

    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    def _location(self) -> dict[str, int]:
        chunk, file = divmod(self._file_no, self.chunks_size)
        return {"chunk_index": chunk, "file_index": file}

    def add_episode(
        self, frames: Mapping[str, Any], task: str, metadata: Mapping | None = None
    ) -> int:
        """Appends one episode; returns its index.

        frames: {feature: [T, *shape]} for every feature but the bookkeeping ones (images
        [T, H, W, 3] uint8). task: its language instruction. metadata: per-episode values (bool,
        int, float, str or a 1-D numeric list), the same keys for every episode, stored as
        columns of the episodes table. Raises `ValueError` for missing, extra or misshapen
        features, non-finite floats or other metadata keys (nothing is written then)."""
        self._check_open()
        data = self._check_frames(frames)
        metadata = dict(metadata or {})
        keys = tuple(sorted(metadata))
        if self._meta_keys is not None and keys != self._meta_keys:
            raise ValueError(f"episode metadata keys {keys} differ from {self._meta_keys}")
        if any(k in _EPISODE_COLUMNS or k.startswith(_EPISODE_PREFIXES) for k in keys):
            raise ValueError(f"metadata keys {keys} clash with the episodes table's columns")
        self._meta_keys = keys
        if self._file_frames >= self.frames_per_file:
            self._flush()
        t, ep = len(next(iter(data.values()))), len(self._episodes)
        task_index = self._tasks.setdefault(str(task), len(self._tasks))
        frame_index = np.arange(t, dtype=np.int64)
        data |= {
            "timestamp": (frame_index / self.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(t, ep, np.int64),
            "index": self._frames + frame_index,
            "task_index": np.full(t, task_index, np.int64),
        }
        record = {
            "episode_index": ep,
            "tasks": [str(task)],
            "length": t,
            "dataset_from_index": self._frames,
            "dataset_to_index": self._frames + t,
            **{f"data/{k}": v for k, v in self._location().items()},
        }
        for key, ft in self.features.items():
            x = data[key]
            if ft["dtype"] == "video":
                self._append_video(key, x)
                start = self._file_frames / self.fps
                record |= {f"videos/{key}/{k}": v for k, v in self._location().items()}
                record[f"videos/{key}/from_timestamp"] = start
                record[f"videos/{key}/to_timestamp"] = start + t / self.fps
            elif ft["dtype"] == "image":
                self._rows[key] += [{"bytes": b, "path": None} for b in map_threads(_png, x)]
            else:
                self._rows[key].append(x)
            if key in self._stats:
                self._update_stats(key, x)
        self._episodes.append(record | metadata)
        self._file_frames += t
        self._frames += t
        return ep

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError(f"writer for {self.root} is already finalized or aborted")

    def _check_frames(self, frames: Mapping[str, Any]) -> dict[str, np.ndarray]:
        wanted = [k for k in self.features if k not in DEFAULT_FEATURES]
        missing = sorted(set(wanted) - set(frames))
        unknown = sorted(set(frames) - set(wanted))
        if missing or unknown:
            raise ValueError(f"episode features: missing {missing}, unknown {unknown}")
        out, lengths = {}, set()
        for key in wanted:
            ft = self.features[key]
            dtype = {"video": np.uint8, "image": np.uint8, "string": object}.get(ft["dtype"])
            dtype = np.dtype(ft["dtype"]) if dtype is None else dtype
            x = np.asarray(frames[key])
            shape = tuple(ft["shape"])
            if x.shape[1:] != shape and not (shape == (1,) and x.ndim == 1):
                raise ValueError(f"{key}: frames of shape {x.shape[1:]}, feature shape {shape}")
            if ft["dtype"] in VISUAL and x.dtype != np.uint8:
                raise ValueError(f"{key}: images must be uint8, not {x.dtype}")
            if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
                raise ValueError(f"{key}: non-finite values")
            out[key] = x.reshape(len(x), *shape).astype(dtype, copy=False)
            if shape == (1,):
                out[key] = out[key][:, 0]
            lengths.add(len(x))
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"episode features need one common length > 0, got {lengths}")
        return out

    def _update_stats(self, key: str, x: np.ndarray) -> None:
        if self.features[key]["dtype"] in VISUAL:  # per channel, pixels in [0, 1]
            x = x.reshape(-1, 3)[:: max(1, x.size // 3 // 200_000)] / 255.0
        self._stats[key].update(x.reshape(len(x), -1))

    def _append_video(self, key: str, images: np.ndarray) -> None:
        import imageio_ffmpeg

        if key not in self._videos:
            path = self.tmp / VIDEO_PATH.format(video_key=key, **self._location())
            path.parent.mkdir(parents=True, exist_ok=True)
            codec, crf, pix_fmt, gop = self._video_options
            h, w = self.features[key]["shape"][:2]
            params = ["-crf", str(crf), "-g", str(gop)]
            gen = imageio_ffmpeg.write_frames(
                str(path),
                (w, h),
                fps=self.fps,
                codec=_ENCODERS[codec],
                pix_fmt_out=pix_fmt,
                output_params=params,
                **_FFMPEG,
            )
            gen.send(None)
            self._videos[key] = gen
        for image in images:
            self._videos[key].send(np.ascontiguousarray(image).tobytes())

    def _flush(self) -> None:
        """Writes the current data file, closes the current videos, starts the next file."""
        for gen in self._videos.values():
            gen.close()
        self._videos = {}
        if self._rows:
            columns = {}
            for key, rows in self._rows.items():
                ft = self.features[key]
                if ft["dtype"] == "image":
                    columns[key] = pa.array(rows, _IMAGE_TYPE)
                else:
                    columns[key] = _to_arrow(np.concatenate(rows), ft)
            path = self.tmp / DATA_PATH.format(**self._location())
            path.parent.mkdir(parents=True, exist_ok=True)
            order = [k for k in self.features if k in columns]
            pq.write_table(pa.table({k: columns[k] for k in order}), path)
            self._rows = collections.defaultdict(list)
            self._file_no += 1
        self._file_frames = 0

    def finalize(self) -> Path:
        """Writes the metadata and renames the temporary folder to `root`; returns `root`."""
        self._check_open()
        try:
            if not self._episodes:
                raise ValueError(f"no episodes to write to {self.root}")
            self._flush()
            self._write_meta()
        except BaseException:
            self.abort()
            raise
        self._done = True
        old = None
        if self.root.exists():  # checked at construction: overwrite=True or an empty folder
            old = self.root.parent / f"{self.root.name}.old-{os.getpid()}-{id(self)}"
            os.replace(self.root, old)
        os.replace(self.tmp, self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.root

    def _write_meta(self) -> None:
        meta, features = self.tmp / "meta", self._info_features()
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": len(self._episodes),
            "total_frames": self._frames,
            "total_tasks": len(self._tasks),
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{len(self._episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if any(v.get("info") for v in features.values()) else None,
            "features": features,
        } | self.info
        meta.mkdir(parents=True, exist_ok=True)
        (meta / "info.json").write_text(json.dumps(info, indent=4))
        shapes = {k: (3, 1, 1) if f["dtype"] in VISUAL else f["shape"] for k, f in features.items()}
        stats = {k: s.as_dict(tuple(shapes[k])) for k, s in self._stats.items()}
        (meta / "stats.json").write_text(json.dumps(stats, indent=4))
        tasks = [{"task_index": i, "task": t} for t, i in self._tasks.items()]
        pq.write_table(pa.Table.from_pylist(tasks), meta / "tasks.parquet")
        where = {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        records = [r | where for r in self._episodes]
        path = self.tmp / EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(records), path)

    def _info_features(self) -> dict[str, dict]:
        """The features for info.json; videos with lerobot's "info" (codec, size, fps)."""
        out = {k: dict(ft) for k, ft in self.features.items()}
        for ft in out.values():
            if ft["dtype"] == "video":
                (h, w, c), (codec, _, pix_fmt, _) = ft["shape"], self._video_options
                values = (h, w, codec, pix_fmt, False, self.fps, c, False)
                ft["info"] = dict(zip(_VIDEO_INFO, values, strict=True))
        return out

    def abort(self) -> None:
        """Closes the open videos and removes the temporary folder (idempotent)."""
        for gen in self._videos.values():
            try:
                gen.close()
            except Exception:  # ffmpeg may already have failed; the folder goes anyway
                pass
        self._videos = {}
        self._done = True
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.finalize()


_VIDEO_INFO = ("video.height", "video.width", "video.codec", "video.pix_fmt")
_VIDEO_INFO += ("video.is_depth_map", "video.fps", "video.channels", "has_audio")
_FFMPEG = {"quality": None, "macro_block_size": 1, "ffmpeg_log_level": "error"}
_ENCODERS = {"h264": "libx264", "av1": "libsvtav1"}
_IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _normalize_feature(key: str, ft: Mapping) -> dict:
    dtype, shape = ft.get("dtype"), ft.get("shape")
    if dtype not in (*NUMERIC, *VISUAL, "string"):
        raise ValueError(f"feature {key}: unsupported dtype {dtype!r}")
    if dtype in VISUAL and (len(shape) != 3 or shape[2] != 3):
        raise ValueError(f"feature {key}: images need shape [H, W, 3], got {shape}")
    if dtype not in VISUAL and (len(shape) != 1 or shape[0] < 1):
        raise ValueError(f"feature {key}: only 1-D features are supported, got shape {shape}")
    return {"dtype": dtype, "shape": [int(s) for s in shape], "names": ft.get("names")}


def _to_arrow(x: np.ndarray, ft: dict) -> pa.Array:
    if ft["dtype"] == "string":
        return pa.array([str(s) for s in x], pa.string())
    if ft["shape"] == [1]:
        return pa.array(x)
    flat = pa.array(x.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, ft["shape"][0])


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


__all__ = [
    "CODEBASE_VERSION",
    "DEFAULT_FEATURES",
    "Writer",
    "make_features",
]
