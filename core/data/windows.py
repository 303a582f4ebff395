"""Which frames an item stacks for each feature, and which of them are padding.

A policy asks for frame offsets per feature (``PolicyConfig.delta_indices``:
``{"action": [0..chunk-1], "observation.state": [-1, 0]}``). For the item at frame ``i``
the stacked frames are ``i + offset``, clamped to ``i``'s episode: offsets before the
episode's first frame repeat it, offsets past its last frame repeat that one, and both
are flagged in ``<feature>_is_pad`` — what LeRobot's ``delta_timestamps`` gives, and
what the inference queue does after ``reset``. A window never reads another episode.

Every dataset (in memory or on disk) computes windows here, so they cannot disagree.
Torch-free: datasets and samplers use it in workers and in the main process.
"""

from __future__ import annotations

import numpy as np

from lerobot_kit.core.errors import ConfigError

# delta_indices keys naming features by kind: a policy config is built before the dataset
# exists and cannot know their names. ALL_CAMERAS: every camera (diffusion's image history);
# ALL_OBSERVATIONS: every feature named observation.* (state, cameras, an environment state),
# the features LeRobot's delta_timestamps give its policies' observation offsets.
ALL_CAMERAS = "observation.images.*"
ALL_OBSERVATIONS = "observation.*"


def expand_delta_indices(
    delta_indices: dict[str, list[int]], features: dict[str, bool]
) -> dict[str, np.ndarray]:
    """``delta_indices`` with ``ALL_CAMERAS`` replaced by each camera and ``ALL_OBSERVATIONS``
    by each observation feature; ``features`` maps every feature key to whether it is a
    camera. A feature named itself takes its own offsets over a wildcard's, and a camera
    ``ALL_CAMERAS``' over ``ALL_OBSERVATIONS``'. An unknown feature is a ``ConfigError``."""
    targets = {
        ALL_CAMERAS: sorted(k for k, is_camera in features.items() if is_camera),
        ALL_OBSERVATIONS: sorted(k for k in features if k.startswith("observation.")),
    }
    narrowest_first = {ALL_CAMERAS: 1, ALL_OBSERVATIONS: 2}  # a named feature: 0
    out: dict[str, np.ndarray] = {}
    for key, offsets in sorted(delta_indices.items(), key=lambda item: narrowest_first.get(item[0], 0)):
        for target in targets.get(key, [key]):
            out.setdefault(target, np.asarray(offsets, dtype=np.int64))
    unknown = sorted(set(out) - set(features))
    if unknown:
        raise ConfigError(
            f"the policy asks for frame offsets of {unknown}, which this dataset lacks "
            f"(it has {sorted(features)}); pick a dataset with those features"
        )
    return out


class EpisodeWindows:
    """Frame ``i`` → its episode's ``[start, end)``, and clamped windows inside it.

    ``lengths`` are the episode lengths in storage order; frames are numbered 0..N-1
    across them. Built from lengths alone, so a dataset on disk needs only its episode
    metadata, not its frames.
    """

    def __init__(self, lengths: np.ndarray) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) and lengths.min() <= 0:
            raise ValueError(f"episode lengths must be positive, got {lengths.tolist()}")
        self.lengths = lengths
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # [E+1]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def episode_of(self, i: int) -> int:
        """Position (0..E-1) of the episode holding frame ``i``."""
        return int(np.searchsorted(self.starts, i, side="right") - 1)

    def check_index(self, i: int) -> int:
        """``i`` as a frame number in ``[0, N)`` (negative counts from the end), else IndexError."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"frame {i} out of range for a dataset of {n} frames")
        return int(i) % n

    def window(self, i: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Frames ``i + offsets`` clamped to ``i``'s episode, and the mask of clamped ones."""
        episode = self.episode_of(i)
        start, end = self.starts[episode], self.starts[episode + 1]
        wanted = i + offsets
        is_pad = (wanted < start) | (wanted >= end)
        return np.clip(wanted, start, end - 1), is_pad
