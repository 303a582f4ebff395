"""``--dataset.mixture``: each member opened as the single-dataset reader opens one, then
joined by ``MixtureDataset`` (``lerobot_kit.api``), which owns the union of features,
padding, placeholders, statistics and shares.

A member's problem (missing folder, damaged file, NaN in a column) is reported as the
single reader reports it, prefixed with the member's ``repo_id``, so a mixture of hundreds
names which dataset to fix. Opening a member reads its metadata only; its data files and
videos are opened by the worker that first reads one of its frames.
"""

from __future__ import annotations

from lerobot_kit.api import ConfigError, LerobotError, MixtureDataset, MixtureMember, member_delta_indices
from lerobot_kit.plugins.datasets.lerobot.meta import LeRobotInfo
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig


def make_lerobot_mixture(config: LeRobotDatasetConfig, delta_indices: dict[str, list[int]]) -> MixtureDataset:
    from lerobot_kit.plugins.datasets.lerobot.reader import open_lerobot_dataset

    assert config.mixture is not None
    members = []
    for spec in config.mixture:
        rename = dict(spec["rename_map"])
        member_config = LeRobotDatasetConfig(
            repo_id=spec["repo_id"], root=spec["root"], revision=spec["revision"], episodes=spec["episodes"],
            video_backend=config.video_backend, allow_download=config.allow_download,
        )

        def offsets(info: LeRobotInfo, rename: dict[str, str] = rename) -> dict[str, list[int]]:
            return member_delta_indices(delta_indices, rename, list(info.features))

        try:
            dataset = open_lerobot_dataset(member_config, offsets)
        except LerobotError as exc:
            raise _named(exc, spec["repo_id"]) from exc
        members.append(MixtureMember(spec["repo_id"], dataset, rename, spec["weight"]))
    return MixtureDataset(members, delta_indices, config.mixture_alpha)


def _named(exc: LerobotError, repo_id: str) -> LerobotError:
    """``exc`` with the member it came from in front, as the same kind of error."""
    # The single reader names its flags; a member sets them as fields of its entry.
    text = str(exc).replace("--dataset.root=", "its \"root\" ").replace("--dataset.root", "its \"root\"")
    message = f"mixture member {repo_id}: {text}"
    try:
        return type(exc)(message)
    except TypeError:  # an error class whose constructor takes other arguments
        return ConfigError(message)
