"""The data contract between dataset plugins, processors and policies.

``FeatureSpec``/``DatasetMeta`` describe a dataset without its frames (they travel into
checkpoints as ``dataset_meta.json``, so a loaded policy knows its shapes and stats
without the data). ``PolicyDataset`` is what a dataset factory returns;
``InMemoryDataset`` is a ready implementation over per-frame numpy arrays that any
plugin holding its frames in memory can reuse (chunking, padding, stats).

The module is torch-free at import (torch is imported when an item is built), so
``inspect-checkpoint`` and config code can read a ``DatasetMeta`` without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lerobot_kit.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
STAT_NAMES = ("mean", "std", "min", "max")


def pad_key(feature: str) -> str:
    """Name of the bool mask flagging frames of ``feature`` that were padded."""
    return f"{feature}_is_pad"


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
            shape: tuple[int, ...] = (array.shape[1], 1, 1)
            values = _uint8_channel_stats(array)
        elif spec.dtype == "float32":
            data = array.astype(np.float64)
            shape = spec.shape
            values = {"mean": data.mean(0), "std": data.std(0), "min": data.min(0), "max": data.max(0)}
        else:
            continue
        stats[key] = {name: np.asarray(v, dtype=np.float32).reshape(shape) for name, v in values.items()}
    return stats



def _uint8_channel_stats(images: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of uint8 [N,C,H,W] on the [0,1] scale, from a 256-bin histogram per channel."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    out: dict[str, list[float]] = {name: [] for name in STAT_NAMES}
    for c in range(images.shape[1]):
        counts = np.bincount(images[:, c].ravel(), minlength=256).astype(np.float64)
        mean = (counts * levels).sum() / counts.sum()
        present = np.nonzero(counts)[0]
        out["mean"].append(mean)
        out["std"].append(np.sqrt((counts * (levels - mean) ** 2).sum() / counts.sum()))
        out["min"].append(levels[present[0]])
        out["max"].append(levels[present[-1]])
    return {name: np.asarray(v) for name, v in out.items()}


class PolicyDataset:
    """What a dataset factory returns: ``meta`` plus map-style access to training items.

    An item holds ``observation.state`` float32 [state_dim], optional
    ``observation.images.<cam>`` float32 [3,H,W] in [0,1], every feature named in
    ``delta_indices`` stacked over its offsets (``action`` float32 [chunk, action_dim])
    with a ``<feature>_is_pad`` bool mask, and ``episode_index``/``index`` int64 scalars.

    Not a subclass of ``torch.utils.data.Dataset`` so that this module stays torch-free;
    DataLoader and samplers only need ``__len__``/``__getitem__``, which is all that
    base class adds.
    """

    meta: DatasetMeta

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class InMemoryDataset(PolicyDataset):
    """A ``PolicyDataset`` over per-frame arrays held in memory, episodes stored contiguously.

    ``frames`` maps feature keys to arrays with one row per frame: float32 features as
    ``[N, *shape]``, images as uint8 ``[N, 3, H, W]`` (4x smaller than float; scaled to
    [0,1] per item). A stacked feature never reads across its episode's bounds: offsets
    past either end repeat the edge frame and are flagged in ``<feature>_is_pad``.
    """

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
        unknown = sorted(set(delta_indices) - set(frames))
        if unknown:
            raise ConfigError(
                f"the policy asks for frame offsets of {unknown}, which this dataset lacks "
                f"(it has {sorted(frames)}); pick a dataset with those features"
            )
        self.delta_indices = {k: np.asarray(v, dtype=np.int64) for k, v in delta_indices.items()}
        # For every frame, the [start, end) frame range of its episode.
        _, starts, counts = np.unique(self.episode_index, return_index=True, return_counts=True)
        per_episode = np.repeat(np.arange(len(starts)), counts)
        self._start = starts[per_episode]
        self._end = (starts + counts)[per_episode]

    def __len__(self) -> int:
        return len(self.episode_index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import torch

        if not -len(self) <= i < len(self):
            raise IndexError(f"frame {i} out of range for a dataset of {len(self)} frames")
        i = int(i) % len(self)
        item: dict[str, torch.Tensor] = {}
        for key, array in self.frames.items():
            offsets = self.delta_indices.get(key)
            if offsets is None:
                value = array[i]
            else:
                idx = i + offsets
                is_pad = (idx < self._start[i]) | (idx >= self._end[i])
                value = array[np.clip(idx, self._start[i], self._end[i] - 1)]
                item[pad_key(key)] = torch.from_numpy(is_pad)
            tensor = torch.tensor(value)
            if self.meta.features[key].is_image:
                tensor = tensor.to(torch.float32) / 255.0
            item[key] = tensor
        item["episode_index"] = torch.tensor(self.episode_index[i], dtype=torch.int64)
        item["index"] = torch.tensor(i, dtype=torch.int64)
        return item
