"""A LeRobot v3.0 dataset (``--dataset.repo_id``) as a ``PolicyDataset`` that holds no frames.

Construction reads metadata only — ``meta/info.json``, the episode table, task texts,
``meta/stats.json`` and the parquet footers of the data files (to catch a truncated
file at start-up rather than mid-run) — so ``len``, features and stats are known
without loading a frame; only the float columns of a data file not yet cached are read,
to find NaN/inf before training (``finite``). Items are assembled on demand, in whichever
process asks (DataLoader workers, in training):

- numeric features, ``timestamp`` and encoded images come from the memory-mapped
  column cache of each data file (``columns``), built on first use; a process keeps a
  bounded number of data files mapped, all its datasets together;
- images stored in the data files are decoded per item (``images``);
- video frames are decoded per item with PyAV, by a bounded per-process pool of
  decoders shared by all its datasets (``video``), at the timestamps LeRobot's reader
  would query; a request's cameras are read at once, on threads (``camera_threads``).

Stacked features (``delta_indices``, cameras included) are windows inside the item's
episode with padding flags (``core.data.windows``), as LeRobot's ``delta_timestamps``.
A dataset pickles without open files or maps, so each worker opens its own.

Normalisation stats come from ``meta/stats.json`` (dataset-wide, also when
``--dataset.episodes`` selects a subset, as in LeRobot); features it lacks get stats
computed from the selected episodes (``stats``).
"""

from __future__ import annotations

import uuid
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from lerobot_kit.api import (
    DatasetMeta,
    EpisodeWindows,
    MixtureDataset,
    PolicyDataset,
    camera_to_float,
    expand_delta_indices,
    pad_key,
)
from lerobot_kit.plugins.datasets.lerobot import images, video
from lerobot_kit.plugins.datasets.lerobot.camera_threads import read_cameras
from lerobot_kit.plugins.datasets.lerobot.columns import FileColumns, cached_file_columns, episode_rows
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError, require_pil, require_pyarrow
from lerobot_kit.plugins.datasets.lerobot.finite import check_finite
from lerobot_kit.plugins.datasets.lerobot.locate import locate_dataset
from lerobot_kit.plugins.datasets.lerobot.meta import (
    INFO_FILE,
    EpisodeRow,
    LeRobotInfo,
    VideoRef,
    read_episodes,
    read_info,
    read_stats,
    read_tasks,
    select_episodes,
)
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig

if TYPE_CHECKING:
    from pathlib import Path

    import torch


class LeRobotDataset(PolicyDataset):
    """The selected episodes of a LeRobot v3.0 dataset, frames read per item.

    ``tasks`` maps task index to text. Each item carries its frame's ``task`` text, as
    LeRobot's reader hands it out, when the dataset has a task table and task indices
    (language-conditioned policies tokenize it); every other value is a tensor.
    """

    def __init__(
        self,
        info: LeRobotInfo,
        all_episodes: dict[int, EpisodeRow],
        episodes: list[EpisodeRow],
        delta_indices: dict[str, list[int]],
        av: ModuleType | None,
        *,
        repo_id: str,
        tasks: dict[int, str],
    ) -> None:
        self.info = info
        self.root = info.root
        self.repo_id = repo_id
        self.tasks = tasks
        self.episodes = episodes
        self.windows = EpisodeWindows(np.array([row.length for row in episodes], dtype=np.int64))
        features = {key: source.spec for key, source in info.features.items()}
        self.delta_indices = expand_delta_indices(delta_indices, {k: f.is_image for k, f in features.items()})
        self._layout = _ItemLayout(info, self.delta_indices)
        self._video_paths: dict[tuple[str, int, int], Path] = {}
        self._in_file = {
            data_file: [row for row in all_episodes.values() if row.data_file == data_file]
            for data_file in {row.data_file for row in episodes}
        }
        first_rows = {f: episode_rows(rows) for f, rows in self._in_file.items()}
        # Per selected episode: the row of its first frame in its data file's column cache.
        self._first_row = np.array([first_rows[row.data_file][row.index] for row in episodes], dtype=np.int64)
        self._owner = uuid.uuid4().hex  # its maps in the process's shared cache; unique across processes
        spans = [int(offsets.max() - offsets.min()) + 1 for key, offsets in self.delta_indices.items()
                 if info.features[key].kind == "video"]
        self._videos = video.VideoDecoders(av, info.fps, keep=max(spans, default=1)) if av is not None else None
        self.meta = DatasetMeta(
            features=features, stats={}, fps=info.fps, num_episodes=len(episodes), num_frames=len(self.windows)
        )

    def __len__(self) -> int:
        return len(self.windows)

    def episode_lengths(self) -> np.ndarray:
        return self.windows.lengths

    def columns(self, data_file: tuple[int, int]) -> FileColumns:
        """The memory-mapped columns of a data file, kept open by the process's shared cache
        (each process, a forked worker too, maps the files itself)."""
        return cached_file_columns(self._owner, self.info, data_file, self._in_file[data_file])

    def episode_arrays(self, position: int) -> tuple[FileColumns, np.ndarray]:
        """Columns of the ``position``-th selected episode's data file, and its frames' rows there."""
        row = self.episodes[position]
        first = self._first_row[position]
        return self.columns(row.data_file), np.arange(first, first + row.length)

    def item(self, i: int, *, uint8_cameras: bool = False) -> dict[str, torch.Tensor]:
        return self.items([i], uint8_cameras=uint8_cameras)[0]

    def items(self, indices: list[int], *, uint8_cameras: bool = False) -> list[dict[str, torch.Tensor]]:
        """The items at ``indices``, those of one data file read together: one gather per numeric
        column, and per camera one pass of the decoder over the frames each video file holds
        (the cameras at once, on threads). Random sampling's items, one per episode, cost one
        request per batch instead of one per item; block sampling (a run of consecutive frames
        per request) turns into one sequential decode. A mixture hands each member its share
        of a batch, often one item: the fixed cost of a request is kept to plain-Python work
        where NumPy's per-call cost would exceed the work (``distinct``)."""
        frames = np.array([self.windows.check_index(i) for i in indices], dtype=np.int64)
        positions = np.searchsorted(self.windows.starts, frames, side="right") - 1
        by_file: dict[tuple[int, int], list[int]] = {}
        for slot, position in enumerate(positions.tolist()):
            by_file.setdefault(self.episodes[position].data_file, []).append(slot)
        out: list[dict[str, torch.Tensor]] = [{} for _ in frames]
        for data_file, slots in by_file.items():
            chosen = np.array(slots)
            self._file_items(data_file, frames[chosen], positions[chosen], [out[s] for s in slots], uint8_cameras)
        return out

    def _file_items(
        self, data_file: tuple[int, int], frames: np.ndarray, positions: np.ndarray,
        items: list[dict[str, torch.Tensor]], uint8_cameras: bool,
    ) -> None:
        """The items of one data file: every feature's frames worked out in one array op
        (``_ItemLayout``), then one gather per numeric column and one read per camera."""
        import torch

        layout = self._layout
        starts, ends = self.windows.starts[positions][:, None], self.windows.starts[positions + 1][:, None]
        to_row = self._first_row[positions][:, None] - starts  # frame number -> cache row, per item
        columns = self.columns(data_file)
        wanted = frames[:, None] + layout.offsets
        # np.minimum/np.maximum: np.clip's dispatch costs more than the clamp of a few frames.
        rows = np.minimum(np.maximum(wanted, starts), ends - 1) + to_row
        pads = ((wanted < starts) | (wanted >= ends)).tolist()
        decoded = read_cameras(lambda key: self._camera_windows(key, positions, rows[:, layout.columns[key]]),
                               layout.cameras, video.KEPT_DECODERS)
        for key, where, pad_name in layout.numeric:
            gathered = columns.numeric[key][rows[:, where].ravel()]
            values = torch.from_numpy(gathered.reshape(len(items), -1, *gathered.shape[1:]))
            per_item = values.unbind() if pad_name else values[:, 0].unbind()
            for item, value in zip(items, per_item):
                item[key] = value
        for key, where, pad_name in layout.video_or_image:
            for item, window in zip(items, decoded[key]):
                value = channels_first(window)
                value = value if uint8_cameras else camera_to_float(value)
                item[key] = value if pad_name else value[0]
        if layout.stacked:
            flags = torch.tensor(pads, dtype=torch.bool).unbind()
            for item, flag in zip(items, flags):
                for key, where, pad_name in layout.stacked:
                    item[pad_name] = flag[where]
        episode_indices = np.array([self.episodes[p].index for p in positions.tolist()], dtype=np.int64)
        # Views of one tensor each, as the padding flags: a tensor apiece costs more than the rest of a small item.
        for item, episode_tensor, index in zip(items, torch.from_numpy(episode_indices).unbind(),
                                               torch.from_numpy(frames).unbind()):
            item["episode_index"] = episode_tensor
            item["index"] = index
        self._add_tasks(items, columns, frames + to_row[:, 0], episode_indices)

    def _camera_windows(self, key: str, positions: np.ndarray, rows: np.ndarray) -> list[list[np.ndarray]]:
        """Per item, the uint8 ``[H, W, C]`` frames of camera ``key`` at its cache rows (``rows[j]``,
        of the ``positions[j]``-th episode), each distinct frame read once: a video file's frames
        in one request, whichever episodes they belong to; stored images per episode."""
        video_kind = self.info.features[key].kind == "video"
        groups: dict[Any, list[int]] = {}
        for j, position in enumerate(positions.tolist()):
            episode = self.episodes[position]
            groups.setdefault(self._video_file(key, episode.videos[key]) if video_kind else position, []).append(j)
        out: list[list[np.ndarray]] = [[] for _ in positions]
        width = rows.shape[1]
        for group, members in groups.items():
            unique, inverse, first = distinct(rows[members].ravel().tolist())
            if video_kind:
                episodes = positions[[members[k // width] for k in first]]
                found = self._video_frames(group, key, unique, episodes)
            else:
                found = self.camera_frames(key, group, unique)
            for n, j in enumerate(members):
                out[j] = [found[k] for k in inverse[n * width : (n + 1) * width]]
        return out

    def _video_file(self, key: str, ref: VideoRef) -> Path:
        """``info.video_file``, remembered: building the path costs more than a small frame's decode."""
        where = (key, ref.chunk_index, ref.file_index)
        path = self._video_paths.get(where)
        if path is None:
            path = self._video_paths[where] = self.info.video_file(key, ref)
        return path

    def _video_frames(self, path: Path, key: str, rows: np.ndarray, positions: np.ndarray) -> list[np.ndarray]:
        """The frames of video ``path`` at cache rows ``rows`` (sorted, distinct), the ``positions[k]``-th
        episode's each."""
        assert self._videos is not None  # a video feature: checked at construction
        source = self.info.features[key]
        data_file = self.episodes[int(positions[0])].data_file
        timestamps = self.columns(data_file).timestamp
        assert timestamps is not None  # checked at construction
        offsets = np.array([self.episodes[p].videos[key].from_timestamp for p in positions.tolist()])
        times = offsets + timestamps[rows].astype(np.float64)
        episodes = [self.episodes[p].index for p in positions.tolist()]
        return self._videos.frames(path, key, episodes, times, source.spec.shape)

    def _add_tasks(
        self, items: list[dict[str, Any]], columns: FileColumns, rows: np.ndarray, episodes: np.ndarray
    ) -> None:
        """Each item's ``task`` text, by its frame's ``task_index``; nothing when the dataset has no
        tasks. ``episodes``: each item's episode index, for the error."""
        if columns.task_index is None or not self.tasks:
            return
        for item, task_index, episode in zip(items, columns.task_index[rows].tolist(), episodes.tolist()):
            text = self.tasks.get(int(task_index))
            if text is None:
                raise LeRobotDatasetError(
                    f"{self.root}: a frame of episode {episode} has task_index {task_index}, which meta/tasks.parquet "
                    f"lacks (it has {sorted(self.tasks)}); the dataset is inconsistent (re-copy or re-download it)"
                )
            item["task"] = text

    def camera_frames(self, key: str, position: int, rows: np.ndarray) -> list[np.ndarray]:
        """uint8 ``[H, W, C]`` frames of camera ``key`` at cache rows of the ``position``-th
        episode, channel-last as decoded (``channels_first`` views them)."""
        episode = self.episodes[position]
        columns = self.columns(episode.data_file)
        source = self.info.features[key]
        if source.kind == "image":
            path = self.info.data_file(*episode.data_file)
            first = self._first_row[position]
            return [
                images.decode_image(columns.encoded_image(key, int(r)), source.spec.shape,
                                    f"{path}: {key!r} of episode {episode.index}, frame {int(r - first)},")
                for r in rows
            ]
        assert self._videos is not None and columns.timestamp is not None  # checked at construction
        ref = episode.videos[key]
        times = ref.from_timestamp + columns.timestamp[rows].astype(np.float64)
        return self._videos.frames(self._video_file(key, ref), key, [episode.index] * len(times), times,
                                   source.spec.shape)


class _ItemLayout:
    """Where each feature's frames lie in one ``[items, frames]`` array of a request: every
    feature's offsets side by side (``offsets``; ``[0]`` for a feature an item does not
    stack), so a request works out all of its frames, clamps and padding flags in one array
    op each instead of one per feature. ``columns[key]`` is the feature's slice of it;
    numeric features, cameras and stacked features (with their padding flag's name) are
    listed as ``(key, slice, padding flag name or "")``."""

    def __init__(self, info: LeRobotInfo, delta_indices: dict[str, np.ndarray]) -> None:
        own_frame = np.zeros(1, dtype=np.int64)
        per_key = [delta_indices.get(key, own_frame) for key in info.features]
        bounds = np.cumsum([0, *map(len, per_key)]).tolist()
        self.offsets = np.concatenate(per_key)[None, :]
        self.columns = {key: slice(bounds[k], bounds[k + 1]) for k, key in enumerate(info.features)}
        listed = [(key, self.columns[key], pad_key(key) if key in delta_indices else "") for key in info.features]
        self.numeric = [entry for entry in listed if info.features[entry[0]].kind == "numeric"]
        self.video_or_image = [entry for entry in listed if info.features[entry[0]].kind != "numeric"]
        self.cameras = [key for key, _, _ in self.video_or_image]
        self.stacked = [entry for entry in listed if entry[2]]


def distinct(values: list[int]) -> tuple[np.ndarray, list[int], list[int]]:
    """The sorted distinct ``values``, each value's position among them, and the first position
    in ``values`` of each distinct one: ``np.unique`` with ``return_inverse`` and
    ``return_index``, in plain Python, which costs a tenth of it for the few values a request holds."""
    unique = sorted(set(values))
    where = {value: k for k, value in enumerate(unique)}
    first: dict[int, int] = {}
    for position, value in enumerate(values):
        first.setdefault(value, position)
    return np.array(unique, dtype=np.int64), [where[value] for value in values], [first[value] for value in unique]


def channels_first(frames: list[np.ndarray]) -> torch.Tensor:
    """uint8 ``[N, C, H, W]`` of channel-last ``[H, W, C]`` frames, as a view (the strides of
    torch's ``channels_last``): one frame is not copied at all, several are stacked with
    plain copies. Values and shape are those of channel-first frames."""
    import torch

    stacked = frames[0][None] if len(frames) == 1 else np.stack(frames)
    return torch.from_numpy(stacked).permute(0, 3, 1, 2)


def make_lerobot_dataset(
    config: LeRobotDatasetConfig, delta_indices: dict[str, list[int]]
) -> LeRobotDataset | MixtureDataset:
    """The dataset factory registered as ``--dataset.type=lerobot``: metadata only, no frames;
    a mixture of such datasets with ``--dataset.mixture`` (``mixture``)."""
    if config.mixture is not None:
        from lerobot_kit.plugins.datasets.lerobot.mixture import make_lerobot_mixture

        return make_lerobot_mixture(config, delta_indices)
    return open_lerobot_dataset(config, lambda info: delta_indices)


def open_lerobot_dataset(
    config: LeRobotDatasetConfig, delta_indices_for: Callable[[LeRobotInfo], dict[str, list[int]]]
) -> LeRobotDataset:
    """One dataset, stacking the frame offsets ``delta_indices_for`` asks for once its schema is read."""
    from lerobot_kit.plugins.datasets.lerobot.stats import complete_stats

    assert config.repo_id is not None  # the config validator requires it
    root = locate_dataset(config.repo_id, config.root, config.revision, config.allow_download)
    info = read_info(root)
    delta_indices = delta_indices_for(info)
    video_keys = info.keys("video")
    av = video.require_video_decoder(config.video_backend, video_keys) if video_keys else None
    for key in info.keys("image"):
        images.check_channels(root / INFO_FILE, key, info.features[key].spec.shape)
    for key in video_keys:
        video.check_channels(root / INFO_FILE, key, info.features[key].spec.shape)
    all_episodes = read_episodes(info)
    episodes = select_episodes(all_episodes, config.episodes)
    _check_data_files(info, all_episodes, episodes)
    for data_file in sorted({row.data_file for row in episodes}):
        check_finite(info, data_file, [row for row in all_episodes.values() if row.data_file == data_file])
    if info.keys("image"):
        require_pil()
    dataset = LeRobotDataset(
        info, all_episodes, episodes, delta_indices, av, repo_id=config.repo_id, tasks=read_tasks(root)
    )
    dataset.meta.stats = complete_stats(dataset, read_stats(root, dataset.meta.features))
    return dataset


def _check_data_files(info: LeRobotInfo, all_episodes: dict[int, EpisodeRow], episodes: list[EpisodeRow]) -> None:
    """Every file the selected episodes need exists; data files hold as many rows as their episodes.

    Reads parquet footers only, so a truncated or missing file stops the run at start-up,
    naming the file, instead of in a DataLoader worker hours later.
    """
    pq = require_pyarrow()
    for data_file in sorted({row.data_file for row in episodes}):
        path = info.data_file(*data_file)
        held = [row for row in all_episodes.values() if row.data_file == data_file]
        what = f"the frames of episode(s) {sorted(r.index for r in held)}"
        if not path.is_file():
            raise LeRobotDatasetError(
                f"{path}: missing; it should hold {what}. The dataset is incomplete: re-copy or re-download it"
            )
        try:
            rows = pq.read_metadata(path).num_rows
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise LeRobotDatasetError(f"{path}: not a readable parquet file ({exc}); it holds {what}") from exc
        expected = sum(row.length for row in held)
        if rows != expected:
            raise LeRobotDatasetError(
                f"{path}: holds {rows} frames, but meta/episodes puts {expected} frames of episode(s) "
                f"{sorted(r.index for r in held)} in it; the dataset is inconsistent (re-copy or re-download it)"
            )
    for key in info.keys("video"):
        for path in sorted({info.video_file(key, row.videos[key]) for row in episodes}):
            if not path.is_file():
                raise LeRobotDatasetError(f"{path}: missing; it holds video {key!r}. The dataset is incomplete")
