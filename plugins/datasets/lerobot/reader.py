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
    expand_delta_indices,
)
from lerobot_kit.plugins.datasets.lerobot import images, video
from lerobot_kit.plugins.datasets.lerobot.columns import FileColumns, cached_file_columns, episode_rows
from lerobot_kit.plugins.datasets.lerobot.files import (
    LeRobotDatasetError,
    require_file,
    require_pil,
    require_pyarrow,
)
from lerobot_kit.plugins.datasets.lerobot.finite import check_finite
from lerobot_kit.plugins.datasets.lerobot.item_reads import ItemLayout, read_items
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
        self._layout = ItemLayout(info, self.delta_indices)
        self._bounds: tuple[list[int], list[int]] | None = None
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
        """The items at ``indices``, read as one request (``item_reads``): one gather per numeric
        column and data file, and per camera one pass of the decoder over the frames each video
        file holds (the cameras at once, on threads). Random sampling's items, one per episode,
        cost one request per batch instead of one per item; block sampling (a run of
        consecutive frames per request) turns into one sequential decode."""
        return read_items(self._layout, [(self, indices)], uint8_cameras)[0]

    @classmethod
    def items_across(
        cls, requests: list[tuple[PolicyDataset, list[int]]], *, uint8_cameras: bool = False
    ) -> list[list[dict[str, torch.Tensor]]]:
        """Members of one layout (same features, shapes and frame offsets) read as one request:
        a mixture's random batch, one item per member, pays a request's fixed work once."""
        by_layout: dict[Any, list[int]] = {}
        for n, (dataset, _) in enumerate(requests):
            assert isinstance(dataset, LeRobotDataset)
            by_layout.setdefault(dataset._layout.signature, []).append(n)
        out: list[list[dict[str, torch.Tensor]]] = [[] for _ in requests]
        for group in by_layout.values():
            first = requests[group[0]][0]
            assert isinstance(first, LeRobotDataset)
            read = read_items(first._layout, [requests[n] for n in group], uint8_cameras)  # type: ignore[misc]
            for n, items in zip(group, read):
                out[n] = items
        return out

    def episode_bounds(self) -> tuple[list[int], list[int]]:
        """The first frame of each selected episode (and the frame count last), and the row of
        each one's first frame in its data file's column cache, as lists: a request looks up
        a few items in them, which plain lists answer faster than arrays."""
        if self._bounds is None:
            self._bounds = (self.windows.starts.tolist(), self._first_row.tolist())
        return self._bounds

    def video_file(self, key: str, ref: VideoRef) -> Path:
        """``info.video_file``, remembered: building the path costs more than a small frame's decode."""
        where = (key, ref.chunk_index, ref.file_index)
        path = self._video_paths.get(where)
        if path is None:
            path = self._video_paths[where] = self.info.video_file(key, ref)
        return path

    def decode_frames(self, path: Path, key: str, episodes: list[int], times: np.ndarray) -> list[np.ndarray]:
        """uint8 ``[H, W, C]`` frames of camera ``key`` nearest to ``times`` in video ``path``
        (``episodes[k]``: the episode of ``times[k]``, for errors), by this process's decoders."""
        assert self._videos is not None  # a video feature: checked at construction
        return self._videos.frames(path, key, episodes, times, self.info.features[key].spec.shape)

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
        return self._videos.frames(self.video_file(key, ref), key, [episode.index] * len(times), times,
                                   source.spec.shape)


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
        require_file(path, what)
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
            require_file(path, f"video {key!r}")
