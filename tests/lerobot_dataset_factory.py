"""Writes small datasets in LeRobot's v3.0 on-disk layout, for tests (no download).

The layout follows LeRobot's own writer: ``meta/info.json`` (schema and path
templates), ``meta/stats.json``, ``meta/tasks.parquet`` (task text as the pandas index
column ``task``), ``meta/episodes/chunk-XXX/file-XXX.parquet`` (one row per episode with
its data/video file and frame range), ``data/chunk-XXX/file-XXX.parquet`` (one row per
frame, several episodes per file) and ``videos/<key>/chunk-XXX/file-XXX.mp4``.

The data is learnable: a point moves toward a target under a speed-limited
proportional controller, and the action is a function of the state, so a policy
trained on it lowers its loss. Cameras render the point and the target as blobs.

Both list encodings of vectors that LeRobot datasets carry in the wild are used:
``observation.state`` as a fixed-size list, ``action`` as a plain list.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

STATE_KEY = "observation.state"
ACTION_KEY = "action"
IMAGE_KEY = "observation.images.top"  # stored as PNG bytes in the data files
VIDEO_KEY = "observation.images.wrist"  # stored as mp4
DONE_KEY = "next.done"
STATE_NAMES = ["x", "y", "target_x", "target_y"]
ACTION_NAMES = ["vx", "vy"]
DEFAULT_TASKS = ("reach the red target", "reach the target slowly")
MAX_SPEED = 0.3
# codec -> (encoder, pixel format, options). "h264": 4:4:4 at quality 0, near-lossless, one key
# frame for a whole test video (a long GOP); "h264_gop2": key frame every 2 frames, B-frames
# allowed; "av1": what LeRobot's recorder writes (SVT-AV1, 4:2:0, GOP 2, crf 30, preset 12).
VIDEO_CODECS = {
    "h264": ("libx264", "yuv444p", {"crf": "0"}),
    "h264_gop2": ("libx264", "yuv420p", {"crf": "18", "g": "2"}),
    "av1": ("libsvtav1", "yuv420p", {"g": "2", "crf": "30", "preset": "12", "svtav1-params": "fast-decode=0"}),
}


@dataclass
class WrittenDataset:
    """What was written, frame-major over all episodes in index order, to compare against."""

    root: Path
    fps: int
    lengths: list[int]
    state: np.ndarray
    action: np.ndarray
    done: np.ndarray
    episode_index: np.ndarray
    task_index: np.ndarray
    tasks: list[str]
    cameras: dict[str, np.ndarray] = field(default_factory=dict)  # key -> uint8 [N, 3, H, W] (when kept)
    camera_stats: dict[str, dict[str, list]] = field(default_factory=dict)  # key -> stats.json entry

    def episode_bounds(self) -> list[tuple[int, int]]:
        ends = np.cumsum(self.lengths)
        return [(int(e - n), int(e)) for e, n in zip(ends, self.lengths)]


def write_lerobot_dataset(
    root: Path,
    episodes: list[int],
    image: bool = False,
    video: bool = False,
    *,
    fps: int = 10,
    image_size: int = 16,
    episodes_per_file: int | None = None,
    chunks_size: int = 1000,
    tasks: tuple[str, ...] = DEFAULT_TASKS,
    stats: bool = True,
    seed: int = 0,
    codec: str = "h264",
    image_shape: tuple[int, int] | None = None,
    keep_cameras: bool = True,
) -> WrittenDataset:
    """Write a v3.0 dataset with one episode per entry of ``episodes`` (its length) under ``root``.

    ``episodes_per_file`` packs that many episodes per data/video/episode-metadata file
    (default: all in one); file ``k`` is ``chunk-{k // chunks_size}/file-{k % chunks_size}``.
    ``image`` adds a PNG camera (``IMAGE_KEY``), ``video`` an mp4 camera (``VIDEO_KEY``, needs
    PyAV) encoded with ``codec`` (``VIDEO_CODECS``), both ``image_size`` square or
    ``image_shape`` (height, width). Camera frames are rendered and written a few at a time;
    ``keep_cameras=False`` does not keep them in ``WrittenDataset.cameras``, so datasets of any
    size can be written. ``stats=False`` leaves out ``meta/stats.json``.
    """
    root = Path(root)
    state, action = _rollout(episodes, fps, seed)
    total = int(sum(episodes))
    episode_index = np.repeat(np.arange(len(episodes)), episodes)
    frame_index = np.concatenate([np.arange(n) for n in episodes])
    done = frame_index == np.repeat(np.asarray(episodes) - 1, episodes)
    task_index = episode_index % len(tasks)
    written = WrittenDataset(root, fps, list(episodes), state, action, done, episode_index, task_index, list(tasks))
    height, width = image_shape or (image_size, image_size)
    backgrounds = ({IMAGE_KEY: 40} if image else {}) | ({VIDEO_KEY: 90} if video else {})
    cameras = _Cameras(state, height, width, backgrounds, keep_cameras)

    per_file = episodes_per_file or len(episodes)
    groups = [list(range(i, min(i + per_file, len(episodes)))) for i in range(0, len(episodes), per_file)]
    bounds = written.episode_bounds()
    episode_rows: list[list[dict]] = []
    for k, group in enumerate(groups):
        chunk, file = divmod(k, chunks_size)
        lo, hi = bounds[group[0]][0], bounds[group[-1]][1]
        _write_data_file(root / _chunk_file("data", chunk, file, "parquet"), written, lo, hi, frame_index,
                         cameras.frames(IMAGE_KEY, lo, hi) if image else None)
        if video:
            _write_video(root / _chunk_file(f"videos/{VIDEO_KEY}", chunk, file, "mp4"),
                         cameras.frames(VIDEO_KEY, lo, hi), fps, codec)
        rows = []
        for e in group:
            start, end = bounds[e]
            row = {
                "episode_index": e,
                "tasks": [tasks[task_index[start]]],
                "length": end - start,
                "data/chunk_index": chunk,
                "data/file_index": file,
                "dataset_from_index": start,
                "dataset_to_index": end,
                "meta/episodes/chunk_index": chunk,
                "meta/episodes/file_index": file,
            }
            if video:
                row.update({
                    f"videos/{VIDEO_KEY}/chunk_index": chunk,
                    f"videos/{VIDEO_KEY}/file_index": file,
                    f"videos/{VIDEO_KEY}/from_timestamp": (start - lo) / fps,
                    f"videos/{VIDEO_KEY}/to_timestamp": (end - lo) / fps,
                })
            row[f"stats/{ACTION_KEY}/mean"] = action[start:end].mean(0).tolist()
            rows.append(row)
        _write_table(root / _chunk_file("meta/episodes", chunk, file, "parquet"), pa.Table.from_pylist(rows))
        episode_rows.append(rows)

    _write_table(root / "meta/tasks.parquet",
                 pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": list(tasks)}))
    written.camera_stats = cameras.stats()
    if keep_cameras:
        written.cameras = cameras.kept()
    features = _features(image, video, height, width, codec)
    info = {
        "codebase_version": "v3.0",
        "robot_type": "point2d",
        "total_episodes": len(episodes),
        "total_frames": total,
        "total_tasks": len(tasks),
        "chunks_size": chunks_size,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": fps,
        "splits": {"train": f"0:{len(episodes)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4" if video else None,
        "features": features,
    }
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    if stats:
        (root / "meta/stats.json").write_text(json.dumps(dataset_stats(written), indent=4))
    return written


def dataset_stats(written: WrittenDataset) -> dict[str, dict[str, list]]:
    """stats.json content as LeRobot writes it: float features, cameras per channel on [0,1]."""
    out: dict[str, dict[str, list]] = {}
    for key, values in ((STATE_KEY, written.state), (ACTION_KEY, written.action),
                        ("timestamp", np.concatenate([np.arange(n) for n in written.lengths]) / written.fps)):
        data = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
        out[key] = _stats(data, axis=0, keep=None)
    out.update(written.camera_stats)
    return out


class _Cameras:
    """Renders each camera's frames a chunk at a time, counting pixel values for its stats."""

    CHUNK = 64

    def __init__(self, state: np.ndarray, height: int, width: int, backgrounds: dict[str, int], keep: bool) -> None:
        self.state, self.height, self.width, self.backgrounds, self.keep = state, height, width, backgrounds, keep
        self.counts = {key: np.zeros((3, 256), dtype=np.int64) for key in backgrounds}
        self.chunks: dict[str, list[np.ndarray]] = {key: [] for key in backgrounds}

    def frames(self, key: str, lo: int, hi: int) -> Iterator[np.ndarray]:
        for start in range(lo, hi, self.CHUNK):
            chunk = _render(self.state[start : min(start + self.CHUNK, hi)], self.height, self.width,
                            self.backgrounds[key])
            for c in range(3):
                self.counts[key][c] += np.bincount(chunk[:, c].ravel(), minlength=256)
            if self.keep:
                self.chunks[key].append(chunk)
            yield chunk

    def kept(self) -> dict[str, np.ndarray]:
        return {key: np.concatenate(chunks) for key, chunks in self.chunks.items()}

    def stats(self) -> dict[str, dict[str, list]]:
        """Per-channel stats on [0, 1], as LeRobot writes them, from exact pixel-value counts."""
        levels = np.arange(256) / 255.0
        out = {}
        for key, counts in self.counts.items():
            entry: dict[str, list] = {name: [] for name in ("mean", "std", "min", "max", "q01", "q99")}
            for channel in counts:
                n = channel.sum()
                mean = (channel * levels).sum() / n
                cumulative = np.cumsum(channel) / n
                entry["mean"].append([[mean]])
                entry["std"].append([[np.sqrt((channel * (levels - mean) ** 2).sum() / n)]])
                entry["min"].append([[levels[np.nonzero(channel)[0][0]]]])
                entry["max"].append([[levels[np.nonzero(channel)[0][-1]]]])
                entry["q01"].append([[levels[np.searchsorted(cumulative, 0.01)]]])
                entry["q99"].append([[levels[np.searchsorted(cumulative, 0.99)]]])
            entry["count"] = [int(counts[0].sum() // (self.height * self.width))]
            out[key] = entry
        return out


def _stats(data: np.ndarray, axis: int | tuple[int, ...], keep: tuple[int, ...] | None) -> dict[str, list]:
    def shaped(v: np.ndarray) -> list:
        return (v.reshape(keep) if keep else v).tolist()

    return {
        "mean": shaped(data.mean(axis)),
        "std": shaped(data.std(axis)),
        "min": shaped(data.min(axis)),
        "max": shaped(data.max(axis)),
        "q01": shaped(np.quantile(data, 0.01, axis=axis)),
        "q99": shaped(np.quantile(data, 0.99, axis=axis)),
        "count": [int(data.shape[0])],
    }


def hub_snapshot(cache: Path, repo_id: str, commit: str = "a" * 40, ref: str | None = "main") -> Path:
    """The snapshot folder of ``repo_id`` in a Hugging Face hub cache (``refs/<ref>`` pointing at it)."""
    repo_dir = Path(cache) / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    if ref is not None:
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


def _chunk_file(folder: str, chunk: int, file: int, ext: str) -> str:
    return f"{folder}/chunk-{chunk:03d}/file-{file:03d}.{ext}"


def _features(image: bool, video: bool, height: int, width: int, codec: str) -> dict[str, dict]:
    camera_names = ["height", "width", "channels"]
    features: dict[str, dict] = {
        STATE_KEY: {"dtype": "float32", "shape": [len(STATE_NAMES)], "names": STATE_NAMES},
        ACTION_KEY: {"dtype": "float32", "shape": [len(ACTION_NAMES)], "names": {"motors": ACTION_NAMES}},
    }
    if image:
        features[IMAGE_KEY] = {"dtype": "image", "shape": [height, width, 3], "names": camera_names}
    if video:
        features[VIDEO_KEY] = {
            "dtype": "video", "shape": [height, width, 3], "names": camera_names,
            "info": {"video.height": height, "video.width": width, "video.codec": VIDEO_CODECS[codec][0],
                     "video.pix_fmt": VIDEO_CODECS[codec][1]},
        }
    features[DONE_KEY] = {"dtype": "bool", "shape": [1], "names": None}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in ("frame_index", "episode_index", "index", "task_index"):
        features[key] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _write_data_file(path: Path, written: WrittenDataset, lo: int, hi: int, frame_index: np.ndarray,
                     images: Iterator[np.ndarray] | None) -> None:
    columns: dict[str, pa.Array] = {
        STATE_KEY: pa.FixedSizeListArray.from_arrays(pa.array(written.state[lo:hi].ravel()), written.state.shape[1]),
        ACTION_KEY: pa.array(list(written.action[lo:hi]), pa.list_(pa.float32())),
    }
    if images is not None:
        encoded = [{"bytes": _png(frame), "path": None} for chunk in images for frame in chunk]
        columns[IMAGE_KEY] = pa.array(encoded, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    columns[DONE_KEY] = pa.array(written.done[lo:hi])
    columns["timestamp"] = pa.array((frame_index[lo:hi] / written.fps).astype(np.float32))
    columns["frame_index"] = pa.array(frame_index[lo:hi].astype(np.int64))
    columns["episode_index"] = pa.array(written.episode_index[lo:hi].astype(np.int64))
    columns["index"] = pa.array(np.arange(lo, hi, dtype=np.int64))
    columns["task_index"] = pa.array(written.task_index[lo:hi].astype(np.int64))
    _write_table(path, pa.table(columns))


def _write_table(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame.transpose(1, 2, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_video(path: Path, chunks: Iterator[np.ndarray], fps: int, codec: str) -> None:
    """One frame per 1/fps starting at 0, encoded as ``VIDEO_CODECS[codec]`` says."""
    import av

    name, pix_fmt, options = VIDEO_CODECS[codec]
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = None
        i = 0
        for chunk in chunks:
            if stream is None:
                stream = container.add_stream(name, rate=fps, options=options)
                stream.width, stream.height = chunk.shape[3], chunk.shape[2]
                stream.pix_fmt = pix_fmt
            for pixels in chunk:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels.transpose(1, 2, 0)), format="rgb24")
                frame.pts = i
                i += 1
                container.mux(stream.encode(frame))
        assert stream is not None, "a video file needs frames"
        container.mux(stream.encode(None))


def _rollout(lengths: list[int], fps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    states, actions = [], []
    for length in lengths:
        pos, target = rng.uniform(-1, 1, 2), rng.uniform(-0.8, 0.8, 2)
        for _ in range(length):
            command = 0.8 * (target - pos)
            command *= min(1.0, MAX_SPEED / max(float(np.linalg.norm(command)), 1e-12))
            states.append(np.concatenate([pos, target]))
            actions.append(command)
            pos = pos + command * 3.0 / fps
    return np.asarray(states, dtype=np.float32), np.asarray(actions, dtype=np.float32)


def _render(state: np.ndarray, height: int, width: int, background: int) -> np.ndarray:
    """uint8 [N, 3, height, width]: agent blob in red, target blob in green, flat blue background."""
    across, down = np.linspace(-1, 1, width)[None, :], np.linspace(1, -1, height)[:, None]
    out = np.empty((len(state), 3, height, width), dtype=np.uint8)
    for i, (x, y, tx, ty) in enumerate(state):
        agent = np.exp(-(across - x) ** 2 / 0.08) * np.exp(-(down - y) ** 2 / 0.08)
        target = np.exp(-(across - tx) ** 2 / 0.08) * np.exp(-(down - ty) ** 2 / 0.08)
        out[i, 0] = np.round(255 * agent)
        out[i, 1] = np.round(255 * target)
        out[i, 2] = background
    return out
