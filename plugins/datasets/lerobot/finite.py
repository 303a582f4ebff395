"""Non-finite numbers in a dataset, reported when it is opened, by file, column, episode and frame.

One NaN among a dataset's actions makes the loss NaN at the first batch that holds it, and
one optimizer update later every weight. So the float columns of each data file are
checked before training starts rather than left for the training loop to trip over. A
file is checked while it has no column cache entry (``columns``): entries are built only
after the check, so later runs read nothing more. Only the float columns are read (parquet
is columnar: camera bytes stay on disk).
"""

from __future__ import annotations

import numpy as np

from lerobot_kit.plugins.datasets.lerobot.columns import is_cached, numeric_values, row_order
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError, parquet_columns, read_parquet
from lerobot_kit.plugins.datasets.lerobot.meta import EpisodeRow, LeRobotInfo

LISTED_EPISODES = 10  # episodes named in the error beyond the first bad frame's


def check_finite(info: LeRobotInfo, data_file: tuple[int, int], rows_in_file: list[EpisodeRow]) -> None:
    """Raise ``LeRobotDatasetError`` naming the first NaN/inf of ``data_file``'s float columns
    (``rows_in_file``: every episode the file holds)."""
    floats = [f for f in info.features.values() if f.kind == "numeric" and f.spec.dtype == "float32"]
    if not floats or is_cached(info, data_file):
        return
    source = info.data_file(*data_file)
    rows = sorted(rows_in_file, key=lambda r: r.index)
    what = f"the frames of episode(s) {[r.index for r in rows]}"
    extras = ["frame_index"] if "frame_index" in parquet_columns(source, what) else []
    table = read_parquet(source, ["episode_index", *extras, *(f.key for f in floats)], what)
    order = row_order(source, table, rows)
    starts = np.cumsum([0, *(r.length for r in rows)])
    for feature in floats:
        values = numeric_values(source, feature, table.column(feature.key))[order]
        bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
        if len(bad):
            episode_of = [rows[int(np.searchsorted(starts, b, side="right")) - 1].index for b in bad]
            first = int(bad[0])
            frame = first - int(starts[np.searchsorted(starts, first, side="right") - 1])
            value = next(v for v in values[first].ravel() if not np.isfinite(v))
            episodes = sorted(set(episode_of))
            listed = f"{episodes[:LISTED_EPISODES]}"[:-1] + (", ...]" if len(episodes) > LISTED_EPISODES else "]")
            more = f" ({len(bad)} frames of episode(s) {listed} hold non-finite values)" if len(bad) > 1 else ""
            raise LeRobotDatasetError(
                f"{source}: column {feature.key!r} episode {episode_of[0]} frame {frame} holds {value}{more}; "
                "training on it would turn every weight into NaN. fix: clean the dataset (replace those values, "
                "or drop those frames or episodes and rewrite the file)"
            )
