"""``--dataset.mixture``: each member opened as the single-dataset reader opens one, then
joined by ``MixtureDataset`` (``lerobot_kit.api``), which owns the union of features,
padding, placeholders, statistics and shares.

A member's problem (missing folder, damaged file, NaN in a column) is reported as the
single reader reports it, prefixed with the member's ``repo_id``, so a mixture of hundreds
names which dataset to fix (the first in the list, when several have one). Opening a
member reads its metadata only; its data files and videos are opened by the worker that
first reads one of its frames. Members are opened on threads: opening one is mostly
reading small files with pyarrow, which releases the interpreter, so hundreds of members
open side by side on the machine's cores rather than one after another. A mixture whose
members hold more video files than the process may keep open raises its soft open-file
limit toward the hard one (``open_files``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lerobot_kit.api import ConfigError, LerobotError, MixtureDataset, MixtureMember, member_delta_indices
from lerobot_kit.plugins.datasets.lerobot.meta import LeRobotInfo
from lerobot_kit.plugins.datasets.lerobot.open_files import raise_open_file_limit
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig

if TYPE_CHECKING:
    from lerobot_kit.plugins.datasets.lerobot.reader import LeRobotDataset

OPENING_THREADS = 8  # members whose metadata is read at once


def make_lerobot_mixture(config: LeRobotDatasetConfig, delta_indices: dict[str, list[int]]) -> MixtureDataset:
    assert config.mixture is not None
    specs = config.mixture
    pool = ThreadPoolExecutor(min(OPENING_THREADS, len(specs)), thread_name_prefix="mixture-member")
    try:
        datasets = list(pool.map(lambda spec: _open_member(config, spec, delta_indices), specs))
    finally:  # a member's error (or a stop signal) leaves the members not yet started unopened
        pool.shutdown(wait=True, cancel_futures=True)
    _refuse_shared_folders(specs, datasets)
    raise_open_file_limit(sum(_video_files(dataset) for dataset in datasets))
    members = [MixtureMember(spec["repo_id"], dataset, dict(spec["rename_map"]), spec["weight"])
               for spec, dataset in zip(specs, datasets)]
    return MixtureDataset(members, delta_indices, config.mixture_alpha)


def _open_member(config: LeRobotDatasetConfig, spec: dict[str, Any], delta_indices: dict[str, list[int]]
                 ) -> LeRobotDataset:
    from lerobot_kit.plugins.datasets.lerobot.reader import open_lerobot_dataset

    rename = dict(spec["rename_map"])
    member_config = LeRobotDatasetConfig(
        repo_id=spec["repo_id"], root=spec["root"], revision=spec["revision"], episodes=spec["episodes"],
        video_backend=config.video_backend, allow_download=config.allow_download,
    )

    def offsets(info: LeRobotInfo) -> dict[str, list[int]]:
        return member_delta_indices(delta_indices, rename, list(info.features))

    try:
        return open_lerobot_dataset(member_config, offsets)
    except LerobotError as exc:
        raise _named(exc, spec["repo_id"]) from exc


def _refuse_shared_folders(specs: list[dict[str, Any]], datasets: list[LeRobotDataset]) -> None:
    """Two members read from one folder (the same "root" under two ids, or a root that is
    another member's cache folder): the data would be drawn twice as often as its weight
    says, so it is refused as a repeated ``repo_id`` is."""
    first: dict[Path, int] = {}
    for position, dataset in enumerate(datasets):
        folder = Path(dataset.root).resolve()
        earlier = first.setdefault(folder, position)
        if earlier != position:
            raise ConfigError(
                f"mixture member {position} ({specs[position]['repo_id']}) reads the folder {folder} that member "
                f"{earlier} ({specs[earlier]['repo_id']}) reads; each dataset is listed once (raise its weight to "
                "sample it more)"
            )


def _video_files(dataset: LeRobotDataset) -> int:
    """Video files the selected episodes of ``dataset`` are read from: a decoder each, when all stay open."""
    return len({(key, ref.chunk_index, ref.file_index) for row in dataset.episodes for key, ref in row.videos.items()})


def _named(exc: LerobotError, repo_id: str) -> LerobotError:
    """``exc`` with the member it came from in front, as the same kind of error."""
    # The single reader names its flags; a member sets them as fields of its entry.
    text = str(exc).replace("--dataset.root=", "its \"root\" ").replace("--dataset.root", "its \"root\"")
    message = f"mixture member {repo_id}: {text}"
    try:
        return type(exc)(message)
    except TypeError:  # an error class whose constructor takes other arguments
        return ConfigError(message)
