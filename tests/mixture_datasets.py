"""Members of a mixture for tests: LeRobot v3.0 datasets that differ as real robots' do.

``write_lerobot_dataset`` writes one robot layout (a 4-wide state, a 2-wide action, cameras
named ``top``/``wrist``). Real mixtures join robots whose cameras have other names and
whose vectors have other widths, so these helpers rewrite a written dataset in place:
``rename_camera`` moves a camera to another key (schema, episode index, video folder or
data column), ``widen_vectors`` appends entries to the state and action (deterministic
functions of the state, so the data stays learnable and finite) and rewrites the stats
LeRobot would have written for them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_dataset_factory import ACTION_KEY, STATE_KEY, WrittenDataset, write_lerobot_dataset


def rename_camera(root: Path, old: str, new: str) -> None:
    """Move camera ``old`` of the dataset at ``root`` to the key ``new``."""
    info_file = root / "meta/info.json"
    info = json.loads(info_file.read_text())
    info["features"] = {new if key == old else key: value for key, value in info["features"].items()}
    info_file.write_text(json.dumps(info, indent=4))
    stats_file = root / "meta/stats.json"
    if stats_file.is_file():
        stats = json.loads(stats_file.read_text())
        stats_file.write_text(json.dumps({new if k == old else k: v for k, v in stats.items()}, indent=4))
    if (root / "videos" / old).is_dir():
        shutil.move(str(root / "videos" / old), str(root / "videos" / new))
    for folder in ("meta/episodes", "data"):
        for file in sorted((root / folder).rglob("*.parquet")):
            table = pq.read_table(file)
            names = [name.replace(f"videos/{old}/", f"videos/{new}/") if name.startswith(f"videos/{old}/")
                     else new if name == old else name for name in table.column_names]
            pq.write_table(table.rename_columns(names), file)


def widen_vectors(root: Path, written: WrittenDataset, state_extra: int, action_extra: int) -> WrittenDataset:
    """Append ``state_extra`` entries to the state and ``action_extra`` to the action of every
    frame; returns the written data with the wider vectors, to compare against."""
    state = np.concatenate([written.state, _extra(written.state, state_extra, 1.0)], axis=1).astype(np.float32)
    action = np.concatenate([written.action, _extra(written.state, action_extra, 0.5)], axis=1).astype(np.float32)
    for file in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(file)
        rows = table.column("index").to_numpy()
        table = table.set_column(table.column_names.index(STATE_KEY), STATE_KEY, pa.FixedSizeListArray.from_arrays(
            pa.array(state[rows].ravel()), state.shape[1]))
        table = table.set_column(table.column_names.index(ACTION_KEY), ACTION_KEY,
                                 pa.array(list(action[rows]), pa.list_(pa.float32())))
        pq.write_table(table, file)
    info_file = root / "meta/info.json"
    info = json.loads(info_file.read_text())
    for key, values in ((STATE_KEY, state), (ACTION_KEY, action)):
        info["features"][key]["shape"] = [values.shape[1]]
        info["features"][key]["names"] = [f"{key.split('.')[-1]}_{i}" for i in range(values.shape[1])]
    info_file.write_text(json.dumps(info, indent=4))
    stats_file = root / "meta/stats.json"
    if stats_file.is_file():
        stats = json.loads(stats_file.read_text())
        stats[STATE_KEY], stats[ACTION_KEY] = vector_stats_json(state), vector_stats_json(action)
        stats_file.write_text(json.dumps(stats, indent=4))
    written.state, written.action = state, action
    return written


def vector_stats_json(values: np.ndarray) -> dict[str, list]:
    """A vector feature's entry of ``meta/stats.json`` as LeRobot writes it, quantiles included."""
    data = values.astype(np.float64)
    out = {"mean": data.mean(0), "std": data.std(0), "min": data.min(0), "max": data.max(0),
           "count": np.array([len(data)])}
    for q in (1, 10, 50, 90, 99):
        out[f"q{q:02d}"] = np.quantile(data, q / 100, axis=0)
    return {name: np.asarray(value).tolist() for name, value in out.items()}


def _extra(state: np.ndarray, count: int, scale: float) -> np.ndarray:
    columns = [scale * np.sin((i + 1) * state[:, i % state.shape[1]]) for i in range(count)]
    return np.stack(columns, axis=1) if columns else np.zeros((len(state), 0))


def write_member(root: Path, episodes: list[int], *, camera: str | None = None, video: bool = True,
                 state_extra: int = 0, action_extra: int = 0, fps: int = 10, seed: int = 0,
                 tasks: tuple[str, ...] = ("pick the cube",), image_size: int = 16) -> WrittenDataset:
    """A member dataset: one camera (video by default, else a PNG image) under the key
    ``observation.images.<camera>`` (None: no camera), vectors widened as asked."""
    written = write_lerobot_dataset(root, episodes, image=not video and camera is not None,
                                    video=video and camera is not None, fps=fps, seed=seed, tasks=tasks,
                                    image_size=image_size)
    if camera is not None:
        default = "observation.images.wrist" if video else "observation.images.top"
        if default != f"observation.images.{camera}":
            rename_camera(root, default, f"observation.images.{camera}")
    if state_extra or action_extra:
        widen_vectors(root, written, state_extra, action_extra)
    return written
