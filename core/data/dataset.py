"""The data contract between dataset plugins, processors and policies.

``FeatureSpec``/``DatasetMeta`` describe a dataset without its frames (they travel into
checkpoints as ``dataset_meta.json``, so a loaded policy knows its shapes and stats
without the data). ``PolicyDataset`` is what a dataset factory returns;
``InMemoryDataset`` is a ready implementation over per-frame numpy arrays for datasets
that generate their frames (chunking and padding come from ``core.data.windows``).

The module is torch-free at import (torch is imported when an item is built), so
``inspect-checkpoint`` and config code can read a ``DatasetMeta`` without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lerobot_kit.core.data.windows import EpisodeWindows, expand_delta_indices
from lerobot_kit.core.registry.contracts import contract

if TYPE_CHECKING:
    import torch

IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
# Where a sample comes from: its frame (every item holds it) and, in a training batch, the
# epoch of the data order it was drawn in (the training loader adds it). Together they name
# one draw of a frame on any number of ranks and after a resume, for randomness keyed by it.
INDEX_KEY = "index"
EPOCH_KEY = "epoch"
# Which member of a mixture a sample comes from (int64, the position in ``member_names()``):
# per-member metrics group samples by it. Items of a single dataset do not carry it.
MEMBER_KEY = "member"
STAT_NAMES = ("mean", "std", "min", "max")


def pad_key(feature: str) -> str:
    """Name of the bool mask flagging frames of ``feature`` that were padded."""
    return f"{feature}_is_pad"


def missing_key(camera: str) -> str:
    """Name of the bool flag marking a mixture sample whose member has no such camera: its
    frame is a black placeholder that a policy accepting missing cameras masks out."""
    return f"{camera}_is_missing"


def camera_to_float(frames: torch.Tensor) -> torch.Tensor:
    """uint8 camera frames as float32 in [0, 1] (``x / 255``, as LeRobot's readers compute it).

    The same float32 division either way; on the CPU NumPy's, in one pass, which costs a
    third of ``torch.div`` on a uint8 tensor (which casts inside its loop) and less than
    converting first and then dividing in place (the way taken on a GPU). The result has
    the frames' memory layout (``channels_last`` for the reader's frames)."""
    import torch

    if frames.dtype != torch.uint8:
        return frames
    if frames.device.type == "cpu":
        return torch.from_numpy(np.divide(frames.numpy(), np.float32(255.0), dtype=np.float32))
    return frames.float().div_(255.0)


@dataclass(frozen=True)
class FeatureSpec:
    """One per-frame feature: dtype ("float32", "image", "bool", "int64", ...), shape, axis names."""

    dtype: str
    shape: tuple[int, ...]
    names: list[str] | None = None

    @property
    def is_image(self) -> bool:
        return self.dtype == "image"

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FeatureSpec:
        names = d.get("names")
        return cls(dtype=d["dtype"], shape=tuple(int(s) for s in d["shape"]), names=list(names) if names else None)


@contract
@dataclass
class DatasetMeta:
    """Shapes and normalisation stats of a dataset (images: per-channel stats of shape (3,1,1))."""

    features: dict[str, FeatureSpec]
    stats: dict[str, dict[str, np.ndarray]]
    fps: int
    num_episodes: int
    num_frames: int

    def image_keys(self) -> list[str]:
        return sorted(k for k, f in self.features.items() if f.is_image)

    def to_json(self) -> dict[str, Any]:
        # float32 -> Python float -> JSON text -> float32 is exact, so the round trip is lossless.
        return {
            "features": {k: f.to_json() for k, f in self.features.items()},
            "stats": {
                k: {name: np.asarray(v, dtype=np.float32).tolist() for name, v in s.items()}
                for k, s in self.stats.items()
            },
            "fps": self.fps,
            "num_episodes": self.num_episodes,
            "num_frames": self.num_frames,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DatasetMeta:
        return cls(
            features={k: FeatureSpec.from_json(f) for k, f in d["features"].items()},
            stats={
                k: {name: np.asarray(v, dtype=np.float32) for name, v in s.items()} for k, s in d["stats"].items()
            },
            fps=int(d["fps"]),
            num_episodes=int(d["num_episodes"]),
            num_frames=int(d["num_frames"]),
        )


def compute_stats(frames: dict[str, np.ndarray], features: dict[str, FeatureSpec]) -> dict[str, dict[str, np.ndarray]]:
    """Mean/std/min/max over all frames; images (uint8 [N,3,H,W]) per channel on the [0,1] scale.

    Accumulates in float64 (images: exact pixel-value histograms), so the stats do not
    drift with the number of frames.
    """
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, array in frames.items():
        spec = features[key]
        if spec.is_image:
            pixels = PixelStats(array.shape[1])
            pixels.add(array)
            stats[key] = pixels.result()
        elif spec.dtype == "float32":
            stats[key] = vector_stats(array, spec.shape)
    return stats


def vector_stats(array: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """float32 mean/std/min/max over the rows of ``array``, accumulated in float64."""
    data = array.astype(np.float64)
    values = {"mean": data.mean(0), "std": data.std(0), "min": data.min(0), "max": data.max(0)}
    return {name: np.asarray(v, dtype=np.float32).reshape(shape) for name, v in values.items()}


class PixelStats:
    """Per-channel mean/std/min/max of uint8 images on the [0,1] scale, accumulated batch by batch.

    Exact 256-bin histograms per channel, so the result does not depend on how the
    frames were batched, and a dataset on disk can stream its frames through it.
    """

    def __init__(self, channels: int) -> None:
        self.counts = np.zeros((channels, 256), dtype=np.int64)

    def add(self, images: np.ndarray) -> None:
        """Count uint8 ``[N, C, H, W]`` frames."""
        for c in range(self.counts.shape[0]):
            self.counts[c] += np.bincount(images[:, c].ravel(), minlength=256)

    def result(self) -> dict[str, np.ndarray]:
        levels = np.arange(256, dtype=np.float64) / 255.0
        out: dict[str, list[float]] = {name: [] for name in STAT_NAMES}
        for counts in self.counts.astype(np.float64):
            mean = (counts * levels).sum() / counts.sum()
            present = np.nonzero(counts)[0]
            out["mean"].append(mean)
            out["std"].append(np.sqrt((counts * (levels - mean) ** 2).sum() / counts.sum()))
            out["min"].append(levels[present[0]])
            out["max"].append(levels[present[-1]])
        return {name: np.asarray(v, dtype=np.float32).reshape(-1, 1, 1) for name, v in out.items()}


class PolicyDataset:
    """What a dataset factory returns: ``meta`` plus map-style access to training items.

    An item holds ``observation.state`` float32 [state_dim], optional
    ``observation.images.<cam>`` float32 [3,H,W] in [0,1], every feature named in
    ``delta_indices`` stacked over its offsets (``action`` float32 [chunk, action_dim],
    a camera [T,3,H,W]) with a ``<feature>_is_pad`` bool mask (``core.data.windows``),
    and ``episode_index``/``index`` int64 scalars. The training loader adds ``epoch``.

    Map-style per frame, because exact resume replays a permutation of frame indices.
    Construction should read metadata only (``meta`` and the episode lengths), so that
    ``lerobot plan`` and the start-up banner never load frames; frames are read in
    ``__getitem__``, which runs in DataLoader workers, so a dataset must pickle without
    its open files. ``episode_lengths`` tells samplers where episodes begin (frames of an
    episode are contiguous), so a block of frames can stay inside one.

    Implement ``item(i, uint8_cameras=...)`` (``dataset[i]`` calls it), or only
    ``__getitem__``. With ``uint8_cameras`` camera frames come as stored, uint8 in
    [0, 255] (LeRobot's ``return_uint8``): the training loader asks for that, so workers
    ship and collate 4× fewer bytes, and converts them to float (``camera_to_float``)
    once they reached the main process. A dataset may return float frames anyway.

    Not a subclass of ``torch.utils.data.Dataset`` so that this module stays torch-free;
    DataLoader and samplers only need ``__len__``/``__getitem__``, which is all that
    base class adds.
    """

    meta: DatasetMeta
    # Whether an item is read or decoded when asked for (files, video). Only then do
    # DataLoader workers pay off: for items already in memory a worker adds nothing but
    # the copy of each batch between processes, so ``--num_workers`` defaults to 0.
    reads_on_demand: bool = True

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.item(i)

    def item(self, i: int, *, uint8_cameras: bool = False) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def items(self, indices: list[int], *, uint8_cameras: bool = False) -> list[dict[str, torch.Tensor]]:
        """Several items at once (a DataLoader request); a dataset may read them together."""
        return [self.item(i, uint8_cameras=uint8_cameras) for i in indices]

    @classmethod
    def items_across(
        cls, requests: list[tuple[PolicyDataset, list[int]]], *, uint8_cameras: bool = False
    ) -> list[list[dict[str, torch.Tensor]]]:
        """The items of several datasets of this type, one list per ``(dataset, indices)``: a
        mixture's batch spreads over its members, often one item each, and a type that reads
        them in one pass (paying a request's fixed work once) overrides this."""
        return [dataset.items(indices, uint8_cameras=uint8_cameras) for dataset, indices in requests]

    def episode_lengths(self) -> np.ndarray:
        raise NotImplementedError

    def member_names(self) -> list[str]:
        """Names of a mixture's members, indexed by the ``MEMBER_KEY`` of its items; empty for
        a single dataset."""
        return []

    def member_frames(self) -> np.ndarray | None:
        """Frames per member, members laid end to end in the index space (member ``m`` holds
        indices ``sum(frames[:m]) ..``); None for a single dataset."""
        return None

    def member_shares(self) -> np.ndarray | None:
        """The fraction of the samples each member should get (sums to 1); None for a single
        dataset, which is sampled uniformly."""
        return None


class InMemoryDataset(PolicyDataset):
    """A ``PolicyDataset`` over per-frame arrays held in memory, episodes stored contiguously.

    For generated datasets (the embedded reach task, the contrib plugin's pendulum) whose
    frames are computed, not read. ``frames`` maps feature keys to arrays with one row
    per frame: float32 features as ``[N, *shape]``, images as uint8 ``[N, 3, H, W]`` (4x
    smaller than float; scaled to [0,1] per item).
    """

    reads_on_demand = False

    def __init__(
        self,
        meta: DatasetMeta,
        frames: dict[str, np.ndarray],
        episode_index: np.ndarray,
        delta_indices: dict[str, list[int]],
    ) -> None:
        self.meta = meta
        self.frames = frames
        self.episode_index = np.asarray(episode_index, dtype=np.int64)
        n = len(self.episode_index)
        for key, array in frames.items():
            if key not in meta.features:
                raise ValueError(f"frames key {key!r} has no FeatureSpec in the dataset meta")
            if len(array) != n:
                raise ValueError(f"feature {key!r} has {len(array)} frames, episode_index has {n}")
        if n and np.any(np.diff(self.episode_index) < 0):
            raise ValueError("episodes must be stored contiguously, in increasing episode_index order")
        self.delta_indices = expand_delta_indices(
            delta_indices, {k: meta.features[k].is_image for k in frames}
        )
        _, counts = np.unique(self.episode_index, return_counts=True)
        self.windows = EpisodeWindows(counts)

    def __len__(self) -> int:
        return len(self.episode_index)

    def episode_lengths(self) -> np.ndarray:
        return self.windows.lengths

    def item(self, i: int, *, uint8_cameras: bool = False) -> dict[str, torch.Tensor]:
        import torch

        i = self.windows.check_index(i)
        item: dict[str, torch.Tensor] = {}
        for key, array in self.frames.items():
            offsets = self.delta_indices.get(key)
            if offsets is None:
                value = array[i]
            else:
                rows, is_pad = self.windows.window(i, offsets)
                value = array[rows]
                item[pad_key(key)] = torch.from_numpy(is_pad)
            tensor = torch.tensor(value)
            if self.meta.features[key].is_image and not uint8_cameras:
                tensor = camera_to_float(tensor)
            item[key] = tensor
        item["episode_index"] = torch.tensor(self.episode_index[i], dtype=torch.int64)
        item[INDEX_KEY] = torch.tensor(i, dtype=torch.int64)
        return item
