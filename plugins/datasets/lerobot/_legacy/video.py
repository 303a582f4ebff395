"""Video features: frames decoded from ``videos/<key>/chunk-*/file-*.mp4`` with PyAV.

A v3.0 video file concatenates many episodes; an episode's frame with timestamp ``t``
(the ``timestamp`` column) is the video frame shown at ``from_timestamp + t``, where
``from_timestamp`` comes from the episode's row in ``meta/episodes``. Each file is
decoded once, front to back, keeping only frames that some selected frame asks for;
a frame further than ``TOLERANCE_FRAMES`` frame periods from its query is an error (the
video and the data disagree), never a silent nearest-neighbour guess.

PyAV (``pip install 'lerobot-kit[video]'``) is the only decoder: it ships its own
FFmpeg with AV1 (LeRobot's default codec) and H.264 decoders.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from types import ModuleType

import numpy as np

from lerobot_kit.core.errors import ConfigError
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError
from lerobot_kit.plugins.datasets.lerobot.meta import EpisodeRow, LeRobotInfo

VIDEO_EXTRA = "pip install 'lerobot-kit[video]' (or: pip install av)"
BACKENDS = ("pyav",)
TOLERANCE_FRAMES = 0.4
FRAME_FORMATS = {1: "gray", 3: "rgb24"}


def require_video_decoder(backend: str | None, video_keys: list[str]) -> ModuleType:
    """The ``av`` module, or an error naming the extra that provides it."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(
            f"--dataset.video_backend={backend} is not supported; supported: {', '.join(BACKENDS)} "
            "(or leave it unset)"
        )
    try:
        import av
    except ImportError as exc:
        raise LeRobotDatasetError(
            f"this dataset stores {video_keys} as video (dtype 'video' in meta/info.json); decoding needs PyAV: "
            f"{VIDEO_EXTRA}"
        ) from exc
    return av


def decode_episodes(
    av: ModuleType, info: LeRobotInfo, key: str, episodes: list[EpisodeRow], timestamps: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """uint8 ``[length, C, H, W]`` frames of ``key`` per episode index."""
    by_file: dict[Path, list[EpisodeRow]] = defaultdict(list)
    for row in episodes:
        by_file[info.video_file(key, row.videos[key])].append(row)
    tolerance = TOLERANCE_FRAMES / info.fps
    out: dict[int, np.ndarray] = {}
    for path, rows in sorted(by_file.items()):
        queries = {row.index: row.videos[key].from_timestamp + timestamps[row.index].astype(np.float64) for row in rows}
        wanted = np.sort(np.concatenate(list(queries.values())))
        times, frames = _decode_file(av, path, key, info.features[key].spec.shape, wanted, tolerance)
        for index, query in queries.items():
            pick, distance = _nearest(times, query)
            unmatched = np.flatnonzero(distance > tolerance)
            if len(unmatched):
                first = int(unmatched[0])
                found = f"nearest frame at {times[pick[first]]:.4f}s" if len(times) else "no frames decoded"
                raise LeRobotDatasetError(
                    f"{path}: episode {index} needs the frame at {query[first]:.4f}s of {key!r} but the video has "
                    f"{found}; the video does not match meta/episodes (from_timestamp) and the timestamp column"
                )
            out[index] = frames[pick]
    return out


def _decode_file(
    av: ModuleType, path: Path, key: str, shape: tuple[int, ...], wanted: np.ndarray, tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    """Presentation times and frames of ``path`` that lie within ``tolerance`` of a wanted time."""
    if not path.is_file():
        raise LeRobotDatasetError(f"{path}: missing; it holds video {key!r}. The dataset is incomplete")
    channels, height, width = shape
    pixel_format = FRAME_FORMATS.get(channels)
    if pixel_format is None:
        raise LeRobotDatasetError(f"video feature {key!r} has {channels} channels; supported: 1, 3")
    times: list[float] = []
    frames: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            for frame in container.decode(video=0):
                if frame.time is None:
                    raise LeRobotDatasetError(f"{path}: a frame of {key!r} has no presentation timestamp")
                if frame.time > wanted[-1] + tolerance:
                    break
                _, distance = _nearest(wanted, np.array([frame.time]))
                if distance[0] > tolerance:
                    continue
                pixels = frame.to_ndarray(format=pixel_format)
                pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], -1).transpose(2, 0, 1)
                if pixels.shape != (channels, height, width):
                    raise LeRobotDatasetError(
                        f"{path}: frames of {key!r} are {pixels.shape[2]}x{pixels.shape[1]}; "
                        f"meta/info.json declares {width}x{height}"
                    )
                times.append(frame.time)
                frames.append(pixels)
    except LeRobotDatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - FFmpeg errors come in many types
        raise LeRobotDatasetError(f"{path}: cannot decode video {key!r}: {type(exc).__name__}: {exc}") from exc
    order = np.argsort(np.asarray(times), kind="stable")
    stacked = np.stack(frames)[order] if frames else np.empty((0, *shape), dtype=np.uint8)
    return np.asarray(times, dtype=np.float64)[order], stacked


def _nearest(sorted_times: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest entry of ``sorted_times`` to each query, and the distance to it."""
    if not len(sorted_times):
        return np.zeros(len(query), dtype=np.int64), np.full(len(query), np.inf)
    right = np.clip(np.searchsorted(sorted_times, query), 0, len(sorted_times) - 1)
    left = np.clip(right - 1, 0, len(sorted_times) - 1)
    use_left = np.abs(sorted_times[left] - query) <= np.abs(sorted_times[right] - query)
    pick = np.where(use_left, left, right)
    return pick, np.abs(sorted_times[pick] - query)
