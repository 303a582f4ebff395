"""A request's items read together, from one LeRobot dataset or from several of one layout.

A mixture's random batch spreads over members, often one item each; read one member at
a time, each item paid a request's fixed work (a dozen small array ops, a tensor per
value) for one frame's decode. Here every item of a request, whichever member it comes
from, is worked out at once: its frames, clamps and padding flags in one array op for
all features (``ItemLayout``), the numeric columns gathered once per data file, each
camera's frames read once per video file (the cameras at once, on threads), and the
values turned into tensors once per feature. A single dataset's request is the case of
one member. Members share a layout when they have the same features under the same
names and ask for the same frame offsets (``ItemLayout.signature``).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from lerobot_kit.api import camera_to_float, pad_key
from lerobot_kit.plugins.datasets.lerobot import video
from lerobot_kit.plugins.datasets.lerobot.camera_threads import read_cameras
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError

if TYPE_CHECKING:
    import torch

    from lerobot_kit.plugins.datasets.lerobot.columns import FileColumns
    from lerobot_kit.plugins.datasets.lerobot.meta import LeRobotInfo
    from lerobot_kit.plugins.datasets.lerobot.reader import LeRobotDataset


class ItemLayout:
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
        self.kinds = {key: info.features[key].kind for key in info.features}
        self.stacked = [entry for entry in listed if entry[2]]
        # Datasets whose requests can be read as one: same features, kinds, shapes and offsets.
        self.signature = (
            tuple((key, source.kind, source.spec.shape, source.spec.dtype) for key, source in info.features.items()),
            tuple(self.offsets[0].tolist()),
        )


class _Request:
    """Where each item of a request lies: its dataset, episode position, frame, episode bounds
    and the offset from a frame number to its row in the data file's column cache."""

    def __init__(self, requests: list[tuple[LeRobotDataset, list[int]]]) -> None:
        self.datasets: list[LeRobotDataset] = []
        self.positions: list[int] = []
        frames: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        to_row: list[int] = []
        for dataset, indices in requests:
            bounds, first_rows = dataset.episode_bounds()
            for i in indices:
                frame = dataset.windows.check_index(i)
                position = bisect.bisect_right(bounds, frame) - 1
                self.datasets.append(dataset)
                self.positions.append(position)
                frames.append(frame)
                starts.append(bounds[position])
                ends.append(bounds[position + 1])
                to_row.append(first_rows[position] - bounds[position])
        self.frames = np.array(frames, dtype=np.int64)
        self.starts = np.array(starts, dtype=np.int64)[:, None]
        self.ends = np.array(ends, dtype=np.int64)[:, None]
        self.to_row = np.array(to_row, dtype=np.int64)[:, None]
        self.episodes = [dataset.episodes[p] for dataset, p in zip(self.datasets, self.positions)]
        # Items of one data file of one dataset: their values come from one gather per column,
        # and a mixture's members lie in runs, so a group is mostly a slice of the request.
        by_data_file: dict[tuple[int, tuple[int, int]], list[int]] = {}
        for j, (dataset, episode) in enumerate(zip(self.datasets, self.episodes)):
            by_data_file.setdefault((id(dataset), episode.data_file), []).append(j)
        self.item_columns: list[FileColumns] = [None] * len(frames)  # type: ignore[list-item]
        self.file_groups: list[tuple[FileColumns, slice | list[int]]] = []
        for js in by_data_file.values():
            columns = self.datasets[js[0]].columns(self.episodes[js[0]].data_file)
            for j in js:
                self.item_columns[j] = columns
            self.file_groups.append((columns, slice(js[0], js[-1] + 1) if js[-1] - js[0] + 1 == len(js) else js))
        order = [j for js in by_data_file.values() for j in js]
        self.unsort = None if order == sorted(order) else np.argsort(order)

    def __len__(self) -> int:
        return len(self.frames)

    def gather(self, column: Callable[[FileColumns], np.ndarray], rows: np.ndarray) -> np.ndarray:
        """``[items, frames, ...]`` of each item's data-file ``column`` at its cache ``rows``: one
        gather per data file (a single dataset's request: one in all), laid in item order."""
        if len(self.file_groups) == 1:
            return column(self.file_groups[0][0])[rows]
        gathered = np.concatenate([column(columns)[rows[where]] for columns, where in self.file_groups])
        return gathered if self.unsort is None else gathered[self.unsort]


def read_items(
    layout: ItemLayout, requests: list[tuple[LeRobotDataset, list[int]]], uint8_cameras: bool
) -> list[list[dict[str, Any]]]:
    """The items of each ``(dataset, indices)``, all datasets of ``layout``, read as one request."""
    import torch

    request = _Request(requests)
    wanted = request.frames[:, None] + layout.offsets
    # np.minimum/np.maximum: np.clip's dispatch costs more than the clamp of a few frames.
    rows = np.minimum(np.maximum(wanted, request.starts), request.ends - 1) + request.to_row
    items: list[dict[str, Any]] = [{} for _ in range(len(request))]
    decoded = read_cameras(lambda key: _camera_windows(request, key, rows[:, layout.columns[key]]),
                           layout.cameras, video.KEPT_DECODERS)
    for key, where, pad_name in layout.numeric:
        gathered = request.gather(lambda columns: columns.numeric[key], rows[:, where])
        values = torch.from_numpy(gathered)
        for item, value in zip(items, values.unbind() if pad_name else values[:, 0].unbind()):
            item[key] = value
    for key, where, pad_name in layout.video_or_image:
        for item, window in zip(items, decoded[key]):
            value = channels_first(window)
            value = value if uint8_cameras else camera_to_float(value)
            item[key] = value if pad_name else value[0]
    if layout.stacked:
        pads = ((wanted < request.starts) | (wanted >= request.ends)).tolist()
        for item, flag in zip(items, torch.tensor(pads, dtype=torch.bool).unbind()):
            for key, where, pad_name in layout.stacked:
                item[pad_name] = flag[where]
    episode_indices = np.array([episode.index for episode in request.episodes], dtype=np.int64)
    # Views of one tensor each, as the padding flags: a tensor apiece costs more than the rest of a small item.
    for item, episode_tensor, index in zip(items, torch.from_numpy(episode_indices).unbind(),
                                           torch.from_numpy(request.frames).unbind()):
        item["episode_index"] = episode_tensor
        item["index"] = index
    _add_tasks(request, items, (request.frames[:, None] + request.to_row)[:, 0].tolist())
    out, first = [], 0
    for _, indices in requests:
        out.append(items[first : first + len(indices)])
        first += len(indices)
    return out


def _camera_windows(request: _Request, key: str, rows: np.ndarray) -> list[list[np.ndarray]]:
    """Per item, the uint8 ``[H, W, C]`` frames of camera ``key`` at its cache ``rows``: a video
    file's frames in one read, whichever items and episodes they belong to (its decoder
    reads each distinct frame once); stored images per item."""
    width = rows.shape[1]
    out: list[list[np.ndarray]] = [[] for _ in range(len(request))]
    if request.datasets[0].info.features[key].kind != "video":
        for j, (dataset, position) in enumerate(zip(request.datasets, request.positions)):
            out[j] = dataset.camera_frames(key, position, rows[j])
        return out
    stamps = request.gather(lambda columns: columns.timestamp, rows).astype(np.float64)
    times = np.array([episode.videos[key].from_timestamp for episode in request.episodes])[:, None] + stamps
    groups: dict[tuple[int, Any], list[int]] = {}
    for j, (dataset, episode) in enumerate(zip(request.datasets, request.episodes)):
        groups.setdefault((id(dataset), dataset.video_file(key, episode.videos[key])), []).append(j)
    for (_, path), js in groups.items():
        episodes = [request.episodes[j].index for j in js for _ in range(width)]
        found = request.datasets[js[0]].decode_frames(path, key, episodes, times[js[0]] if len(js) == 1 else
                                                      times[js].ravel())
        for n, j in enumerate(js):
            out[j] = found[n * width : (n + 1) * width]
    return out


def _add_tasks(request: _Request, items: list[dict[str, Any]], rows: list[int]) -> None:
    """Each item's ``task`` text, by its frame's ``task_index``; nothing for a dataset without tasks."""
    for j, (item, dataset, row) in enumerate(zip(items, request.datasets, rows)):
        columns = request.item_columns[j]
        if columns.task_index is None or not dataset.tasks:
            continue
        task_index = int(columns.task_index[row])
        text = dataset.tasks.get(task_index)
        if text is None:
            raise LeRobotDatasetError(
                f"{dataset.root}: a frame of episode {request.episodes[j].index} has task_index {task_index}, which "
                f"meta/tasks.parquet lacks (it has {sorted(dataset.tasks)}); the dataset is inconsistent (re-copy "
                "or re-download it)"
            )
        item["task"] = text


def channels_first(frames: list[np.ndarray]) -> torch.Tensor:
    """uint8 ``[N, C, H, W]`` of channel-last ``[H, W, C]`` frames, as a view (the strides of
    torch's ``channels_last``): one frame is not copied at all, several are stacked with
    plain copies. Values and shape are those of channel-first frames."""
    import torch

    stacked = frames[0][None] if len(frames) == 1 else np.stack(frames)
    return torch.from_numpy(stacked).permute(0, 3, 1, 2)
