"""Normalisation statistics of a mixture: those of its members' frames laid end to end.

A mixture is normalised with one set of statistics, so a checkpoint's processors (and
LeRobot loading them) need nothing to know which dataset a frame came from. Each
member's statistics are weighted by its frames in the run:

- ``mean``: the frame-weighted mean of the members' means;
- ``std``: from the pooled variance, ``sum n_m (std_m² + (mean_m - mean)²) / N`` — exactly the
  population std of the concatenated frames;
- ``min``/``max``: over the members;
- quantiles (``q01`` … ``q99``, which LeRobot's QUANTILES normalisation reads): the
  frame-weighted mean of the members' quantiles, an estimate (quantiles of a
  concatenation do not follow from the parts'); kept only when every member has them.

A vector narrower than the mixture's width is zero-padded (``core.data.mixture``), so its
member counts as zeros in the padded entries: statistics of exactly the padded data the
policy sees. A camera counts only the members that have it: a missing camera's black
placeholder is masked out, never seen by the policy.
"""

from __future__ import annotations

import numpy as np

from lerobot_kit.core.data.dataset import STAT_NAMES

MOMENTS = ("mean", "std")


def aggregate_stats(parts: list[tuple[int, dict[str, np.ndarray]]], shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The statistics of ``parts`` — ``(frames, statistics)`` of each member that has the
    feature — concatenated; vectors narrower than ``shape`` are zero-padded first."""
    counts = np.asarray([n for n, _ in parts], dtype=np.float64)
    total = counts.sum()
    padded = [{name: _pad(np.asarray(value, dtype=np.float64), shape) for name, value in stats.items()}
              for _, stats in parts]
    common = set.intersection(*(set(stats) for stats in padded))
    weights = (counts / total).reshape(-1, *([1] * len(shape)))
    out: dict[str, np.ndarray] = {}
    if set(MOMENTS) <= common:
        means = np.stack([s["mean"] for s in padded])
        mean = (weights * means).sum(0)
        spread = np.stack([s["std"] for s in padded]) ** 2 + (means - mean) ** 2
        out["mean"], out["std"] = mean, np.sqrt((weights * spread).sum(0))
    if "min" in common:
        out["min"] = np.min(np.stack([s["min"] for s in padded]), axis=0)
    if "max" in common:
        out["max"] = np.max(np.stack([s["max"] for s in padded]), axis=0)
    for name in sorted(common - set(STAT_NAMES)):
        if name.startswith("q"):
            out[name] = (weights * np.stack([s[name] for s in padded])).sum(0)
    return {name: value.astype(np.float32) for name, value in out.items()}


def _pad(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A vector's statistic zero-padded to ``shape`` (what zero-padded entries have); others as they are."""
    if value.shape == shape:
        return value
    if value.ndim == 1 and len(shape) == 1 and value.shape[0] < shape[0]:
        return np.concatenate([value, np.zeros(shape[0] - value.shape[0])])
    return value.reshape(shape) if value.size == int(np.prod(shape)) else value
