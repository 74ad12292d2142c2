"""Demonstration datasets in lerobot's `LeRobotDataset` layout: the reader (v3.0, and v2.0/v2.1
so that datasets made by other tools load too), with validation. The writer (v3.0) is
`vla.dataset_writer`.

Layout (v3.0; lerobot cannot be a dependency here, see /work/shared/reference/vla.md)::

    OUT/meta/info.json                      codebase_version, fps, features, totals, path templates
    OUT/meta/stats.json                     {feature: {mean, std, min, max, count}}
    OUT/meta/tasks.parquet                  columns task_index (int64), task (string)
    OUT/meta/episodes/chunk-000/file-000.parquet
        episode_index, tasks, length, data/{chunk,file}_index, dataset_{from,to}_index,
        videos/<key>/{chunk_index, file_index, from_timestamp, to_timestamp},
        meta/episodes/{chunk,file}_index, plus any per-episode metadata columns
    OUT/data/chunk-000/file-000.parquet     one row per frame: the non-video features
    OUT/videos/<key>/chunk-000/file-000.mp4 H.264 frames of camera <key>, episodes one after
                                            another (episode e spans [from, to) timestamps)

Every frame row holds `timestamp` (s, float32), `frame_index` (in its episode), `episode_index`,
`index` (in the dataset) and `task_index` (into meta/tasks.parquet), as in lerobot. Features of
shape [1] are scalar columns, other 1-D features fixed-size lists. Camera features have dtype
"video" (mp4, lossy) or "image" (PNG bytes in the parquet column, struct {bytes, path}: lossless).
Images are [H, W, 3] uint8 RGB everywhere in this module. Image statistics are per channel over
pixels scaled to [0, 1], shape [3, 1, 1] (lerobot's convention).

v2.0/v2.1 layout read: meta/episodes.jsonl, meta/tasks.jsonl, data/chunk-000/episode_000000.parquet,
videos/chunk-000/<key>/episode_000000.mp4 (paths from info.json's templates).

A malformed dataset raises `DatasetError` (a `ValueError`) whose message starts with the file and
the field at fault.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

READ_VERSIONS = ("v2.0", "v2.1", "v3.0")
VISUAL = ("video", "image")
NUMERIC = ("float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
_EPISODE_COLUMNS = ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index")
_EPISODE_PREFIXES = ("data/", "videos/", "meta/", "stats/")


class DatasetError(ValueError):
    """A malformed dataset; the message names the file and the field."""


def map_threads(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """`[fn(x) for x in items]` on a thread per core: PNG coding releases the GIL, and an
    episode's frames are its only cost when rendering is on a GPU."""
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(fn, items))


def _error(path: Path | str, field: str, message: str) -> DatasetError:
    return DatasetError(f"{path}: {field}: {message}")


# -- reading ---------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise _error(path, "file", "missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise _error(path, "JSON", f"invalid at line {e.lineno} column {e.colno}: {e.msg}") from e


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise _error(path, "file", "missing")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise _error(path, "JSON", f"invalid at line {n}: {e.msg}") from e
    return rows


def _read_parquet(path: Path) -> pa.Table:
    import pyarrow as pa  # here, not at the top: the sim-side vla tools run without pyarrow
    import pyarrow.parquet as pq

    if not path.is_file():
        raise _error(path, "file", "missing")
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise _error(path, "parquet", str(e)) from e


def _check_info(path: Path, info: Any) -> None:
    if not isinstance(info, dict):
        raise _error(path, "info", "not a JSON object")
    required = ("codebase_version", "fps", "features", "total_episodes", "total_frames")
    for field in (*required, "data_path"):
        if field not in info:
            raise _error(path, field, "missing")
    version = info["codebase_version"]
    if version not in READ_VERSIONS:
        raise _error(path, "codebase_version", f"{version!r} unsupported (read: {READ_VERSIONS})")
    if not isinstance(info["fps"], int | float) or info["fps"] <= 0:
        raise _error(path, "fps", f"must be a positive number, got {info['fps']!r}")
    if not isinstance(info["features"], dict):
        raise _error(path, "features", "not an object")
    for key, ft in info["features"].items():
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise _error(path, f"features.{key}", "needs dtype and shape")
        if ft["dtype"] not in (*NUMERIC, *VISUAL, "string"):
            raise _error(path, f"features.{key}.dtype", f"unsupported {ft['dtype']!r}")
        shape = ft["shape"]
        if not isinstance(shape, list) or not all(isinstance(s, int) and s > 0 for s in shape):
            raise _error(path, f"features.{key}.shape", f"not a list of positive ints: {shape}")
        if ft["dtype"] in VISUAL and (len(shape) != 3 or 3 not in (shape[0], shape[2])):
            raise _error(path, f"features.{key}.shape", f"not an RGB image shape: {shape}")
        if ft["dtype"] == "video" and not info.get("video_path"):
            raise _error(path, "video_path", f"missing (needed for video feature {key})")


def _image_hw(ft: dict) -> tuple[int, int]:
    """(H, W) of an image feature stored [H, W, 3] or [3, H, W] (from `names` when given)."""
    shape, names = ft["shape"], ft.get("names") or []
    if len(names) == 3 and names[0] in ("channel", "channels", "c"):
        return shape[1], shape[2]
    return (shape[0], shape[1]) if shape[2] == 3 else (shape[1], shape[2])


def _column(path: Path, table: pa.Table, key: str, ft: dict) -> np.ndarray | list:
    """Values [N, n] of a list column, [N] of a scalar one, or a list (PNG bytes, strings)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if key not in table.column_names:
        raise _error(path, key, "column missing")
    col = table.column(key).combine_chunks()
    if ft["dtype"] == "image":
        if not pa.types.is_struct(col.type):
            raise _error(path, key, f"image column of type {col.type}, expected struct")
        return col.field("bytes").to_pylist()
    if ft["dtype"] == "string":
        return col.to_pylist()
    n = ft["shape"][0] if len(ft["shape"]) == 1 else None
    try:
        if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type):
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            if n is None or not np.all(lengths == n):
                bad = sorted(set(lengths.tolist()) - {n})
                raise _error(path, key, f"rows of length {bad}, feature shape {ft['shape']}")
            values = col.flatten().to_numpy(zero_copy_only=False)
            return values.astype(ft["dtype"]).reshape(len(col), n)
        if ft["shape"] != [1]:
            raise _error(path, key, f"scalar column, feature shape {ft['shape']}")
        return col.to_numpy(zero_copy_only=False).astype(ft["dtype"])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        if isinstance(e, DatasetError):
            raise
        raise _error(path, key, f"cannot read as {ft['dtype']}: {e}") from e


@dataclasses.dataclass(frozen=True)
class Episode:
    """One episode: frames [start, stop) of the dataset; `tasks` its instructions; `metadata`
    extra per-episode columns (e.g. success, reset seed); `videos` {key: (mp4 path, first frame in
    it)}; `data_file` the parquet file holding its rows."""

    index: int
    length: int
    start: int
    tasks: tuple[str, ...]
    data_file: Path
    videos: dict[str, tuple[Path, int]]
    metadata: dict[str, Any]

    @property
    def stop(self) -> int:
        return self.start + self.length


class LeRobotDataset:
    """Reads a dataset in the LeRobotDataset layout (v3.0, v2.1, v2.0) from local disk.

    `len(ds)` frames; `ds[i]` frame i (of the whole dataset) as {feature: value} with numeric
    features as numpy arrays ([n], or scalars for shape-[1] scalar columns), camera features as
    [H, W, 3] uint8 (decoded from mp4 or PNG; an episode's decoded video is cached, up to
    `cache_bytes`), and "task" (the frame's instruction). With `action_horizon` H, "action" is the
    chunk [H, A] of this and the next actions of the episode and "action_is_pad" [H] bool marks
    the steps past its end (padded by repeating its last action). With `as_tensors`, values are
    torch tensors and images float32 [3, H, W] in [0, 1] (lerobot's convention).

    The metadata and the data files are checked on load (`DatasetError` names the file and the
    field); videos are checked when decoded, or all at once with `verify_videos=True` (decodes
    every video file once to count its frames).
    """

    def __init__(
        self,
        root: str | Path,
        action_horizon: int | None = None,
        as_tensors: bool = False,
        verify_videos: bool = False,
        cache_bytes: int = 1 << 30,
    ):
        self.root = Path(root)
        self.action_horizon, self.as_tensors = action_horizon, as_tensors
        self.cache_bytes = cache_bytes
        self._info_path = self.root / "meta" / "info.json"
        self.info: dict = _read_json(self._info_path)
        _check_info(self._info_path, self.info)
        self.version: str = self.info["codebase_version"]
        self.fps: float = self.info["fps"]
        self.features: dict[str, dict] = self.info["features"]
        self.camera_keys = [k for k, ft in self.features.items() if ft["dtype"] in VISUAL]
        self._video_keys = [k for k in self.camera_keys if self.features[k]["dtype"] == "video"]
        if self.version == "v3.0":
            self.tasks = self._read_tasks_v3()
            self.episodes = self._read_episodes_v3()
        else:
            self.tasks = self._read_tasks_v2()
            self.episodes = self._read_episodes_v2()
        self._check_totals()
        self._starts = np.array([e.start for e in self.episodes], np.int64)
        self._load_data()
        self.stats = self._read_stats()
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cached_bytes = 0
        if verify_videos:
            self.verify_videos()

    # -- metadata ------------------------------------------------------------------------------
    def _template(self, field: str, **kwargs) -> Path:
        try:
            return self.root / self.info[field].format(**kwargs)
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise _error(self._info_path, field, f"bad path template: {e!r}") from e

    def _read_tasks_v3(self) -> dict[int, str]:
        path = self.root / "meta" / "tasks.parquet"
        table = _read_parquet(path)
        name = next((c for c in ("task", "__index_level_0__") if c in table.column_names), None)
        if name is None or "task_index" not in table.column_names:
            raise _error(path, "task" if name is None else "task_index", "column missing")
        return dict(zip(table["task_index"].to_pylist(), table[name].to_pylist(), strict=True))

    def _read_tasks_v2(self) -> dict[int, str]:
        path = self.root / "meta" / "tasks.jsonl"
        rows = _read_jsonl(path)
        for n, row in enumerate(rows, 1):
            if "task_index" not in row or "task" not in row:
                raise _error(path, "task_index" if "task" in row else "task", f"missing (line {n})")
        return {row["task_index"]: row["task"] for row in rows}

    def _read_episodes_v3(self) -> list[Episode]:
        files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise _error(self.root / "meta" / "episodes", "file", "no episodes parquet files")
        rows, where = [], []
        for path in files:
            table = _read_parquet(path)
            needed = ["episode_index", "length", "data/chunk_index", "data/file_index"]
            for key in self._video_keys:
                needed += [f"videos/{key}/{k}" for k in ("chunk_index", "file_index")]
                needed.append(f"videos/{key}/from_timestamp")
            for col in needed:
                if col not in table.column_names:
                    raise _error(path, col, "column missing")
            rows += table.to_pylist()
            where += [path] * table.num_rows
        order = self._check_indices([r["episode_index"] for r in rows], where)
        episodes, start = [], 0
        for i in order:
            row, path = rows[i], where[i]
            if row.get("dataset_from_index", start) != start:
                msg = f"episode {row['episode_index']}: the lengths give {start}"
                raise _error(path, "dataset_from_index", msg)
            videos = {}
            for key in self._video_keys:
                p = f"videos/{key}/"
                loc = {k: row[p + k] for k in ("chunk_index", "file_index")}
                first = round(row[p + "from_timestamp"] * self.fps)
                videos[key] = (self._template("video_path", video_key=key, **loc), first)
            loc = {k: row[f"data/{k}"] for k in ("chunk_index", "file_index")}
            episodes.append(self._episode(row, start, self._template("data_path", **loc), videos))
            start += row["length"]
        return episodes

    def _read_episodes_v2(self) -> list[Episode]:
        path = self.root / "meta" / "episodes.jsonl"
        rows = _read_jsonl(path)
        for n, row in enumerate(rows, 1):
            for field in ("episode_index", "length"):
                if field not in row:
                    raise _error(path, field, f"missing (line {n})")
        order = self._check_indices([r["episode_index"] for r in rows], [path] * len(rows))
        size = self.info.get("chunks_size", 1000)
        episodes, start = [], 0
        for i in order:
            row = rows[i]
            ep = row["episode_index"]
            loc = {"episode_chunk": ep // size, "episode_index": ep}
            videos = {
                k: (self._template("video_path", video_key=k, **loc), 0) for k in self._video_keys
            }
            episodes.append(self._episode(row, start, self._template("data_path", **loc), videos))
            start += row["length"]
        return episodes

    def _episode(self, row: dict, start: int, data_file: Path, videos: dict) -> Episode:
        skip = _EPISODE_COLUMNS
        meta = {
            k: v for k, v in row.items() if k not in skip and not k.startswith(_EPISODE_PREFIXES)
        }
        tasks = row.get("tasks") or []
        tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
        return Episode(row["episode_index"], row["length"], start, tasks, data_file, videos, meta)

    @staticmethod
    def _check_indices(indices: list, where: list[Path]) -> list[int]:
        """Positions of the episodes sorted by index; `DatasetError` unless they are 0..n−1."""
        order = sorted(range(len(indices)), key=lambda i: indices[i])
        for expected, i in enumerate(order):
            if indices[i] != expected:
                msg = f"not 0..{len(order) - 1}: found {indices[i]} where {expected} belongs"
                raise _error(where[i], "episode_index", msg)
        return order

    def _check_totals(self) -> None:
        n, frames = len(self.episodes), sum(e.length for e in self.episodes)
        for field, actual in (("total_episodes", n), ("total_frames", frames)):
            if self.info[field] != actual:
                msg = f"{self.info[field]}, the episodes metadata gives {actual}"
                raise _error(self._info_path, field, msg)
        for e in self.episodes:
            if not isinstance(e.length, int) or e.length < 1:
                raise _error(self.root / "meta", "length", f"episode {e.index}: {e.length!r}")

    def _read_stats(self) -> dict[str, dict[str, np.ndarray]]:
        path = self.root / "meta" / "stats.json"
        if not path.is_file():
            return {}
        raw = _read_json(path)
        return {k: {s: np.asarray(v) for s, v in d.items()} for k, d in raw.items()}

    # -- frames ----------------------------------------------------------------------------------
    def _load_data(self) -> None:
        """Reads every data file once and gathers the non-video columns in episode order."""
        keys = [k for k, ft in self.features.items() if ft["dtype"] != "video"]
        by_file: dict[Path, list[Episode]] = collections.defaultdict(list)
        for e in self.episodes:
            by_file[e.data_file].append(e)
        parts: dict[int, dict[str, Any]] = {}
        for path, episodes in by_file.items():
            table = _read_parquet(path)
            cols = {key: _column(path, table, key, self.features[key]) for key in keys}
            for e, rows in zip(episodes, self._episode_rows(path, table, episodes), strict=True):
                parts[e.index] = {
                    k: [v[r] for r in rows] if isinstance(v, list) else v[rows]
                    for k, v in cols.items()
                }
        self._data: dict[str, Any] = {}
        for key in keys:
            chunks = [parts[e.index][key] for e in self.episodes]
            if isinstance(chunks[0], list):
                self._data[key] = [x for c in chunks for x in c]
            else:
                self._data[key] = np.concatenate(chunks)

    def _episode_rows(self, path: Path, table: pa.Table, episodes: list[Episode]) -> list:
        """Row numbers of each episode in `table`, in frame order; checks the bookkeeping."""

        def ints(name: str) -> np.ndarray | None:
            if name not in table.column_names:
                return None
            return np.asarray(table[name].to_numpy(zero_copy_only=False)).reshape(-1)

        ep_col, frame_col, index_col = ints("episode_index"), ints("frame_index"), ints("index")
        if ep_col is None and len(episodes) > 1:
            raise _error(path, "episode_index", "column missing (the file holds several episodes)")
        out, used = [], 0
        for e in episodes:
            rows = np.flatnonzero(ep_col == e.index) if ep_col is not None else np.arange(e.length)
            if len(rows) != e.length or (ep_col is None and table.num_rows != e.length):
                msg = f"episode {e.index} has {len(rows)} rows, the metadata length {e.length}"
                raise _error(path, "episode_index", msg)
            if frame_col is not None:
                rows = rows[np.argsort(frame_col[rows], kind="stable")]
                if not np.array_equal(frame_col[rows], np.arange(e.length)):
                    raise _error(path, "frame_index", f"episode {e.index}: not 0..{e.length - 1}")
            if index_col is not None and not np.array_equal(
                index_col[rows], e.start + np.arange(e.length)
            ):
                raise _error(path, "index", f"episode {e.index}: not {e.start}..{e.stop - 1}")
            out.append(rows)
            used += len(rows)
        if used != table.num_rows:
            extra = sorted(set(ep_col.tolist()) - {e.index for e in episodes})
            raise _error(path, "episode_index", f"rows of episodes {extra} not placed here")
        return out

    def __len__(self) -> int:
        return int(self.info["total_frames"])

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def episode_of(self, i: int) -> Episode:
        """The episode holding dataset frame i."""
        return self.episodes[int(np.searchsorted(self._starts, i, side="right")) - 1]

    def _frame(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"frame {i} out of range for {n} frames")
        return int(i) % n

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = self._frame(i)
        e = self.episode_of(i)
        item: dict[str, Any] = {}
        for key, ft in self.features.items():
            if ft["dtype"] == "video":
                item[key] = self.episode_video(key, e.index)[i - e.start]
            elif ft["dtype"] == "image":
                item[key] = self._png(key, i)
            else:
                item[key] = self._data[key][i]
        item["task"] = self._task(i, e)
        if self.action_horizon is not None:
            item["action"], item["action_is_pad"] = self.action_chunk(i, self.action_horizon)
        return _to_tensors(item, self.camera_keys) if self.as_tensors else item

    def _task(self, i: int, e: Episode) -> str:
        if "task_index" in self._data:
            t = int(self._data["task_index"][i])
            if t not in self.tasks:
                raise _error(e.data_file, "task_index", f"{t} is not in the tasks table")
            return self.tasks[t]
        return e.tasks[0] if e.tasks else ""

    def _png(self, key: str, i: int) -> np.ndarray:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(self._data[key][i])) as im:
                image = np.asarray(im.convert("RGB"))
        except (OSError, ValueError, TypeError) as err:
            file = self.episode_of(i).data_file
            raise _error(file, key, f"frame {i}: not an image ({err})") from err
        h, w = _image_hw(self.features[key])
        if image.shape != (h, w, 3):
            e = self.episode_of(i)
            raise _error(e.data_file, key, f"image of shape {image.shape}, feature {[h, w, 3]}")
        return image

    def _episode_pngs(self, key: str, e: Episode) -> np.ndarray:
        frames = range(e.start, e.stop)
        return np.stack(map_threads(functools.partial(self._png, key), frames))

    def episode(self, index: int, images: bool = True) -> dict[str, Any]:
        """All frames of episode `index`: {feature: [T, ...]} (images [T, H, W, 3] uint8; left
        out with `images=False`) and "task" (its first frame's instruction). Numpy, whatever
        `as_tensors` says."""
        e = self.episodes[index]
        out: dict[str, Any] = {}
        for key, ft in self.features.items():
            if not images and ft["dtype"] in VISUAL:
                continue
            if ft["dtype"] == "video":
                out[key] = self.episode_video(key, index)
            elif ft["dtype"] == "image":
                out[key] = self._episode_pngs(key, e)
            else:
                out[key] = self._data[key][e.start : e.stop]
        out["task"] = self._task(e.start, e)
        return out

    def action_chunk(self, i: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
        """(actions [H, A] from frame i on within its episode, is_pad [H] bool): past the
        episode's end the last action repeats and is_pad is True."""
        i = self._frame(i)
        e = self.episode_of(i)
        actions = self._data["action"]
        idx = np.arange(i, i + horizon)
        return actions[np.minimum(idx, e.stop - 1)], idx >= e.stop

    # -- videos ----------------------------------------------------------------------------------
    def episode_video(self, key: str, index: int) -> np.ndarray:
        """[T, H, W, 3] uint8 frames of camera `key` in episode `index` (decoded once, cached)."""
        cached = self._cache.get((key, index))
        if cached is not None:
            self._cache.move_to_end((key, index))
            return cached
        e = self.episodes[index]
        path, first = e.videos[key]
        frames = _decode(path, key, first, e.length, self.fps, _image_hw(self.features[key]))
        _check_frame_count(frames, path, key, first, e)
        frames.flags.writeable = False
        self._cache[(key, index)] = frames
        self._cached_bytes += frames.nbytes
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.nbytes
        return frames

    def camera_frames(self, key: str) -> np.ndarray:
        """[len(self), H, W, 3] uint8: every frame of camera `key`, episode after episode. Each
        video file is decoded once, by one ffmpeg process, not once per episode (~0.15 s per
        process), and only one file's frames are held besides the result; the episode cache is
        left as it was."""
        if self.features[key]["dtype"] != "video":
            return np.concatenate([self._episode_pngs(key, e) for e in self.episodes])
        hw = _image_hw(self.features[key])
        rows = np.cumsum([0] + [e.length for e in self.episodes])
        out = np.empty((rows[-1], *hw, 3), np.uint8)
        files: dict[Path, list[tuple[int, Episode]]] = {}
        for i, e in enumerate(self.episodes):
            files.setdefault(e.videos[key][0], []).append((i, e))
        for path, members in files.items():
            n = max(e.videos[key][1] + e.length for _, e in members)
            frames = _decode(path, key, 0, n, self.fps, hw)
            for i, e in members:
                first = e.videos[key][1]
                part = frames[first : first + e.length]
                _check_frame_count(part, path, key, first, e)
                out[rows[i] : rows[i + 1]] = part
        return out

    def verify_videos(self) -> None:
        """Checks the frame size and counts the frames of every video file (decoding it) against
        the episodes that use it; `DatasetError` names the file and the feature."""
        import imageio_ffmpeg

        need: dict[tuple[str, Path], int] = {}
        for e in self.episodes:
            for key, (path, first) in e.videos.items():
                need[(key, path)] = max(need.get((key, path), 0), first + e.length)
        for (key, path), frames in need.items():
            _decode(path, key, 0, 1, self.fps, _image_hw(self.features[key]))  # frame size
            try:
                count, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
            except (RuntimeError, OSError) as err:
                raise _error(path, key, f"unreadable video: {err}") from err
            if count != frames:
                raise _error(path, key, f"{count} frames, the episodes' parquet rows need {frames}")


def _check_frame_count(frames: np.ndarray, path: Path, key: str, first: int, e: Episode) -> None:
    if len(frames) != e.length:
        msg = f"{len(frames)} frames from frame {first}, episode {e.index} has {e.length} rows"
        raise _error(path, key, msg)


def _decode(
    path: Path, key: str, first: int, n: int, fps: float, hw: tuple[int, int]
) -> np.ndarray:
    """[≤ n, H, W, 3] uint8: frames first … first + n − 1 of an mp4 (seeks to half a frame
    before frame `first`, so the first frame at or after it is that frame)."""
    import imageio_ffmpeg

    if not path.is_file():
        raise _error(path, key, "video file missing")
    seek = ["-ss", f"{(first - 0.5) / fps:.6f}"] if first > 0 else None
    h, w = hw
    try:
        gen = imageio_ffmpeg.read_frames(
            str(path), input_params=seek, output_params=["-frames:v", str(n)]
        )
        meta = next(gen)
        if tuple(meta["size"]) != (w, h):
            gen.close()
            raise _error(path, key, f"frames of {meta['size']} px (W, H), feature {h}x{w}")
        frames = [np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in gen]
    except (RuntimeError, OSError, StopIteration) as err:
        raise _error(path, key, f"unreadable video: {err}") from err
    return np.stack(frames) if frames else np.zeros((0, h, w, 3), np.uint8)


def compute_action_chunks(actions: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Action chunks of one episode: actions [T, A] → (chunks [T, H, A], is_pad [T, H] bool);
    chunks[t, k] = actions[min(t + k, T − 1)] and is_pad[t, k] = t + k ≥ T."""
    t = len(actions)
    idx = np.arange(t)[:, None] + np.arange(horizon)[None]
    return np.asarray(actions)[np.minimum(idx, t - 1)], idx >= t


def _to_tensors(item: dict[str, Any], camera_keys: list[str]) -> dict[str, Any]:
    import torch

    out = {}
    for key, value in item.items():
        if isinstance(value, str):
            out[key] = value
        elif key in camera_keys:
            out[key] = torch.from_numpy(np.array(value)).permute(2, 0, 1).float() / 255
        else:
            out[key] = torch.from_numpy(np.array(value))  # a copy: cached arrays are read-only
    return out


__all__ = [
    "DatasetError",
    "Episode",
    "LeRobotDataset",
    "compute_action_chunks",
]
