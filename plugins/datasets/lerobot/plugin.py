"""The LeRobot-format dataset plugin (``--dataset.repo_id=user/name``): config and registration.

Torch-free and pyarrow-free so that ``lerobot train --help`` lists these flags without
importing either; the reader lives in ``reader`` beside it and loads on first use.
"""

from __future__ import annotations

from typing import Callable, ClassVar

from pydantic import Field, field_validator

from lerobot_kit.api import DatasetConfig, hookimpl


class LeRobotDatasetConfig(DatasetConfig):
    resume_may_change: ClassVar[frozenset[str]] = DatasetConfig.resume_may_change | {
        "root", "allow_download", "video_backend"
    }

    type: str = "lerobot"
    # Optional with a validated default, so that a missing id is reported by flag name.
    repo_id: str | None = Field(
        None, validate_default=True, description="LeRobot-format dataset id (user/name); required for this type."
    )
    root: str | None = Field(None, description="Local folder of the dataset (else the Hugging Face cache).")
    revision: str | None = Field(
        None, description="Hub revision (branch, tag or commit) to read from the cache or download; default v3.0/main."
    )
    episodes: list[int] | None = Field(None, description="Load only these episode indices, e.g. '[0,2,5]'.")
    video_backend: str | None = Field(
        None, description="Video decoder for video features: pyav (default; pip install 'lerobot-kit[video]')."
    )
    allow_download: bool = Field(
        False, description="Download from the Hugging Face Hub if not found locally (off: runs stay offline)."
    )

    @field_validator("repo_id")
    @classmethod
    def _repo_id_is_user_slash_name(cls, value: str | None) -> str:
        if value is None:
            raise ValueError("required for --dataset.type=lerobot: give the dataset id as --dataset.repo_id=user/name")
        owner, sep, name = value.partition("/")
        if not sep or not owner or not name or "/" in name:
            raise ValueError("expected a Hugging Face dataset id of the form user/name")
        return value

    @field_validator("episodes")
    @classmethod
    def _episodes_are_indices(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("an empty episode list selects no data; omit --dataset.episodes to load all episodes")
        negative = [e for e in value if e < 0]
        if negative:
            raise ValueError(f"episode indices are >= 0, got {negative}")
        return sorted(set(value))


@hookimpl
def lerobot_register_datasets(register: Callable[..., None]) -> None:
    register("lerobot", LeRobotDatasetConfig, "lerobot_kit.plugins.datasets.lerobot.reader:make_lerobot_dataset")
