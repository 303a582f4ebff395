"""The ``meta/`` folder of a LeRobot v3.0 dataset: schema, episode index, tasks and stats.

``meta/info.json`` holds the schema (features, fps, path templates); one row per
episode in ``meta/episodes/chunk-*/file-*.parquet`` says which data (and video) file
holds the episode and where; ``meta/tasks.parquet`` maps task indices to text;
``meta/stats.json`` holds dataset-wide normalisation stats. Everything is checked here
so that a malformed file is reported once, by name, before any frame is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lerobot_kit.api import STAT_NAMES, FeatureSpec
from lerobot_kit.plugins.datasets.lerobot.files import (
    LeRobotDatasetError,
    parquet_columns,
    read_json,
    read_parquet,
)

SUPPORTED_VERSION = "v3.0"
INFO_FILE = "meta/info.json"
STATS_FILE = "meta/stats.json"
TASKS_FILE = "meta/tasks.parquet"
# Quantile stats LeRobot writes in meta/stats.json (QUANTILES normalisation uses q01/q99, QUANTILE10 q10/q90).
QUANTILE_NAMES = ("q01", "q10", "q50", "q90", "q99")
EPISODES_DIR = "meta/episodes"
# Per-frame bookkeeping columns every LeRobot dataset has; not training features.
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
REQUIRED_INFO_KEYS = ("codebase_version", "fps", "features", "data_path")
CHANNEL_NAMES = ("channel", "channels")
_FLOAT_DTYPES = ("float16", "float32", "float64")
_EXACT_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")

Kind = Literal["numeric", "image", "video"]


@dataclass(frozen=True)
class SourceFeature:
    """A feature as stored (``kind``, ``stored_dtype``) and as items hold it (``spec``)."""

    key: str
    kind: Kind
    stored_dtype: str
    spec: FeatureSpec


@dataclass(frozen=True)
class VideoRef:
    chunk_index: int
    file_index: int
    from_timestamp: float


@dataclass(frozen=True)
class EpisodeRow:
    index: int
    length: int
    data_file: tuple[int, int]
    tasks: list[str]
    videos: dict[str, VideoRef] = field(default_factory=dict)


@dataclass(frozen=True)
class LeRobotInfo:
    root: Path
    fps: int
    features: dict[str, SourceFeature]
    data_path: str
    video_path: str | None

    def keys(self, kind: Kind) -> list[str]:
        return [k for k, f in self.features.items() if f.kind == kind]

    def data_file(self, chunk_index: int, file_index: int) -> Path:
        return self.root / _format(self.root, "data_path", self.data_path, chunk_index=chunk_index,
                                   file_index=file_index)

    def video_file(self, key: str, ref: VideoRef) -> Path:
        assert self.video_path is not None  # checked in read_info when video features exist
        return self.root / _format(self.root, "video_path", self.video_path, video_key=key,
                                   chunk_index=ref.chunk_index, file_index=ref.file_index)


def read_info(root: Path) -> LeRobotInfo:
    """Parse and check ``meta/info.json``; only codebase v3.0 is read."""
    path = root / INFO_FILE
    info = read_json(path)
    if not isinstance(info, dict):
        raise LeRobotDatasetError(f"{path}: expected a JSON object, got {type(info).__name__}")
    missing = [k for k in REQUIRED_INFO_KEYS if k not in info]
    if missing:
        raise LeRobotDatasetError(f"{path}: missing key(s) {missing}; the file is not a complete LeRobot info.json")
    version = info["codebase_version"]
    if version != SUPPORTED_VERSION:
        hint = (
            " Convert it with LeRobot: python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id=<id>"
            if isinstance(version, str) and version.startswith("v2")
            else ""
        )
        raise LeRobotDatasetError(
            f"{path}: codebase_version {version!r} is not supported; this reader reads LeRobot {SUPPORTED_VERSION} "
            f"datasets.{hint}"
        )
    fps = info["fps"]
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0 or fps != int(fps):
        raise LeRobotDatasetError(f"{path}: fps must be a positive whole number, got {fps!r}")
    if not isinstance(info["features"], dict):
        raise LeRobotDatasetError(f"{path}: 'features' must be an object of feature name -> {{dtype, shape, names}}")
    features = {}
    for key, raw in info["features"].items():
        source = _source_feature(path, key, raw)
        if source is not None:
            features[key] = source
    video_path = info.get("video_path")
    if any(f.kind == "video" for f in features.values()) and not isinstance(video_path, str):
        raise LeRobotDatasetError(f"{path}: the dataset has video features but no 'video_path' template")
    if not isinstance(info["data_path"], str):
        raise LeRobotDatasetError(f"{path}: 'data_path' must be a path template string")
    return LeRobotInfo(root, int(fps), features, info["data_path"], video_path)


def _source_feature(path: Path, key: str, raw: Any) -> SourceFeature | None:
    """How ``key`` is loaded, or None for columns items do not carry (bookkeeping, text)."""
    if not isinstance(raw, dict) or "dtype" not in raw or "shape" not in raw:
        raise LeRobotDatasetError(f"{path}: feature {key!r} needs 'dtype' and 'shape', got {raw!r}")
    dtype, shape = raw["dtype"], raw["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s > 0 for s in shape):
        raise LeRobotDatasetError(f"{path}: feature {key!r} has shape {shape!r}; expected a list of positive ints")
    names = _flat_names(raw.get("names"))
    if key in BOOKKEEPING:
        return None
    if dtype in ("image", "video"):
        chw = _channel_first(path, key, tuple(shape), names)
        spec = FeatureSpec("image", chw, ["channels", "height", "width"])
        return SourceFeature(key, dtype, dtype, spec)
    if dtype in _FLOAT_DTYPES:
        return SourceFeature(key, "numeric", dtype, FeatureSpec("float32", tuple(shape), names))
    if dtype in _EXACT_DTYPES:
        kept = "bool" if dtype == "bool" else "int64"
        return SourceFeature(key, "numeric", dtype, FeatureSpec(kept, tuple(shape), names))
    return None  # text ("string") and other non-tensor features


def _flat_names(names: Any) -> list[str] | None:
    """LeRobot writes names as a list, as {"axes": [...]}, or null; items need a flat list or None."""
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def _channel_first(path: Path, key: str, shape: tuple[int, ...], names: list[str] | None) -> tuple[int, ...]:
    """LeRobot stores camera shapes as (height, width, channels); items are (C, H, W)."""
    if len(shape) != 3:
        raise LeRobotDatasetError(f"{path}: camera feature {key!r} has shape {list(shape)}; expected 3 dims")
    if names and len(names) == 3 and names[0] in CHANNEL_NAMES:
        return shape
    if (names and len(names) == 3 and names[2] in CHANNEL_NAMES) or shape[2] in (1, 3, 4):
        return (shape[2], shape[0], shape[1])
    return shape


def _format(root: Path, name: str, template: str, **values: Any) -> str:
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise LeRobotDatasetError(
            f"{root / INFO_FILE}: the {name} template {template!r} cannot be filled ({exc}); "
            "expected placeholders {chunk_index}, {file_index}" + (", {video_key}" if name == "video_path" else "")
        ) from exc


def read_episodes(info: LeRobotInfo) -> dict[int, EpisodeRow]:
    """Every episode's row from ``meta/episodes/*/*.parquet``, keyed by episode index."""
    folder = info.root / EPISODES_DIR
    files = sorted(folder.glob("*/*.parquet"))
    if not files:
        raise LeRobotDatasetError(
            f"{folder}: no episode metadata (chunk-XXX/file-XXX.parquet); the dataset is incomplete"
        )
    video_keys = info.keys("video")
    required = ["episode_index", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"]
    for key in video_keys:
        required += [f"videos/{key}/chunk_index", f"videos/{key}/file_index", f"videos/{key}/from_timestamp"]
    rows: dict[int, EpisodeRow] = {}
    for path in files:
        table = read_parquet(path, required, "per-episode metadata", optional=("length", "tasks")).to_pydict()
        for i, index in enumerate(table["episode_index"]):
            span = table["dataset_to_index"][i] - table["dataset_from_index"][i]
            length = table["length"][i] if "length" in table else span
            if length != span or length <= 0:
                raise LeRobotDatasetError(
                    f"{path}: episode {index} has length {length} but spans frames "
                    f"[{table['dataset_from_index'][i]}, {table['dataset_to_index'][i]}); the file is inconsistent"
                )
            if index in rows:
                raise LeRobotDatasetError(f"{path}: episode {index} is listed twice in {folder}")
            videos = {
                key: VideoRef(
                    int(table[f"videos/{key}/chunk_index"][i]),
                    int(table[f"videos/{key}/file_index"][i]),
                    float(table[f"videos/{key}/from_timestamp"][i]),
                )
                for key in video_keys
            }
            tasks = list(table["tasks"][i] or []) if "tasks" in table else []
            rows[int(index)] = EpisodeRow(
                int(index), int(length), (int(table["data/chunk_index"][i]), int(table["data/file_index"][i])),
                tasks, videos,
            )
    if not rows:
        raise LeRobotDatasetError(f"{folder}: lists no episodes; the dataset is empty")
    return rows


def select_episodes(rows: dict[int, EpisodeRow], wanted: list[int] | None) -> list[EpisodeRow]:
    """The requested episodes in index order (all when ``wanted`` is None)."""
    if wanted is None:
        return [rows[i] for i in sorted(rows)]
    unknown = [e for e in wanted if e not in rows]
    if unknown:
        have = sorted(rows)
        raise LeRobotDatasetError(
            f"--dataset.episodes: {unknown} not in this dataset, which has {len(have)} episodes "
            f"(indices {have[0]}..{have[-1]})"
        )
    return [rows[i] for i in sorted(wanted)]


def read_tasks(root: Path) -> dict[int, str]:
    """task_index -> task text; empty if the dataset has no ``meta/tasks.parquet``."""
    path = root / TASKS_FILE
    if not path.exists():
        return {}
    # pandas writes the task text as the named index "task" (unnamed: "__index_level_0__").
    table = read_parquet(path, ["task_index"], "the task table", optional=("task", "__index_level_0__")).to_pydict()
    text = next((c for c in ("task", "__index_level_0__") if c in table), None)
    if text is None:
        raise LeRobotDatasetError(
            f"{path}: no 'task' column (has {parquet_columns(path, 'the task table')}); expected task text and "
            "task_index"
        )
    return {int(i): str(t) for i, t in zip(table["task_index"], table[text])}


def read_stats(root: Path, features: dict[str, FeatureSpec]) -> dict[str, dict[str, np.ndarray]]:
    """mean/std/min/max of every float and image feature that ``meta/stats.json`` covers,
    and the quantiles LeRobot writes beside them (``q01`` ... ``q99``) where present: its
    quantile normalisation (π0.5's default) reads them.

    Image stats are per channel, shape (C,1,1), on the [0,1] scale LeRobot writes them
    on; vectors take the feature's shape. Features left out are computed by the caller.
    """
    path = root / STATS_FILE
    if not path.exists():
        return {}
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise LeRobotDatasetError(f"{path}: expected a JSON object of feature -> stats")
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, spec in features.items():
        entry = raw.get(key)
        if spec.dtype not in ("float32", "image") or not isinstance(entry, dict):
            continue
        if not all(name in entry for name in STAT_NAMES):
            continue
        shape = (spec.shape[0], 1, 1) if spec.is_image else spec.shape
        stats[key] = {}
        for name in (*STAT_NAMES, *(q for q in QUANTILE_NAMES if q in entry)):
            try:
                with np.errstate(over="ignore"):  # beyond float32's range: inf, refused below
                    value = np.asarray(entry[name], dtype=np.float32)
            except (TypeError, ValueError) as exc:
                raise LeRobotDatasetError(f"{path}: {key}.{name} is not numeric ({exc})") from exc
            if value.size != math.prod(shape):
                raise LeRobotDatasetError(
                    f"{path}: {key}.{name} has {value.size} values; expected shape {list(shape)} "
                    "(stats do not match meta/info.json)"
                )
            _check_finite_stat(path, key, name, entry[name], value)
            stats[key][name] = value.reshape(shape)
    return stats


def _check_finite_stat(path: Path, key: str, name: str, written: Any, value: np.ndarray) -> None:
    """Normalising with a NaN or infinite stat (also a number beyond float32's range, which
    becomes one) turns every batch, then every weight, into NaN at the first step."""
    bad = np.flatnonzero(~np.isfinite(value))
    if not len(bad):
        return
    first = int(bad[0])
    where = "".join(f"[{int(i)}]" for i in np.unravel_index(first, value.shape))
    shown = np.asarray(written, dtype=object).ravel()[first]
    more = f" ({len(bad)} of its {value.size} values are not finite)" if len(bad) > 1 else ""
    raise LeRobotDatasetError(
        f"{path}: {key}.{name}{where} is {shown!r}, not a finite float32{more}; normalising with it would turn "
        f"every weight into NaN. fix: correct it, or remove the {key!r} entry from {STATS_FILE} to have its stats "
        "computed from the data"
    )
