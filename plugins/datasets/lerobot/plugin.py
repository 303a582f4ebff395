"""The LeRobot-format dataset plugin (``--dataset.repo_id=user/name``): config and registration.

Torch-free and pyarrow-free so that ``lerobot train --help`` lists these flags without
importing either; the reader lives in ``reader`` beside it and loads on first use.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from pydantic import Field, field_validator, model_validator

from lerobot_kit.api import DatasetConfig, hookimpl
from lerobot_kit.plugins.datasets.lerobot.mixture_config import parse_mixture


class LeRobotDatasetConfig(DatasetConfig):
    resume_may_change: ClassVar[frozenset[str]] = DatasetConfig.resume_may_change | {
        "root", "allow_download", "video_backend"
    }

    type: str = "lerobot"
    repo_id: str | None = Field(
        None, description="LeRobot-format dataset id (user/name); this or --dataset.mixture is required."
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
    mixture: list[dict[str, Any]] | None = Field(
        None, description="Train on several LeRobot datasets instead of --dataset.repo_id: a JSON list, or the path "
        "of a .json file holding one, of members {\"repo_id\", \"root\", \"revision\", \"weight\", \"rename_map\", "
        "\"episodes\"} (docs/mixtures.md).",
    )
    mixture_alpha: float = Field(
        1.0, ge=0, description="Without member weights, each member's share of the samples is proportional to its "
        "frames**mixture_alpha (1: by frames; 0: equal; pi0 used 0.43).",
    )

    @field_validator("mixture", mode="before")
    @classmethod
    def _mixture_members(cls, value: Any) -> list[dict[str, Any]] | None:
        return None if value is None else parse_mixture(value)

    @model_validator(mode="after")
    def _one_source(self) -> LeRobotDatasetConfig:
        """Exactly one of ``repo_id`` and ``mixture``; the single dataset's options are per member in a mixture."""
        if self.mixture is None:
            if self.repo_id is None:
                raise ValueError(
                    "required for --dataset.type=lerobot: give the dataset id as --dataset.repo_id=user/name "
                    "(or several datasets as --dataset.mixture)"
                )
            if self.mixture_alpha != type(self).model_fields["mixture_alpha"].default:
                raise ValueError("--dataset.mixture_alpha applies to --dataset.mixture only; remove it")
            return self
        given = [name for name in ("repo_id", "root", "revision", "episodes") if getattr(self, name) is not None]
        if given:
            flags = ", ".join(f"--dataset.{name}" for name in given)
            raise ValueError(
                f"--dataset.mixture replaces {flags}: give each member's repo_id, root, revision and episodes in "
                "the mixture, and remove " + flags
            )
        if any(member["weight"] is not None for member in self.mixture) and (
            self.mixture_alpha != type(self).model_fields["mixture_alpha"].default
        ):
            raise ValueError("--dataset.mixture_alpha shapes shares of members without weights, and every member "
                             "has one; remove --dataset.mixture_alpha or the weights")
        return self

    @classmethod
    def resume_views(cls, new: dict[str, Any], recorded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A mixture's members may move to other folders between a run and its resume, as
        ``--dataset.root`` may; the rest of each member is the data the position indexes."""
        return _without_member_roots(new), _without_member_roots(recorded)


    @field_validator("repo_id")
    @classmethod
    def _repo_id_is_user_slash_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
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


def _without_member_roots(dumped: dict[str, Any]) -> dict[str, Any]:
    """A recorded dataset section without its mixture members' folders."""
    mixture = dumped.get("mixture")
    if not isinstance(mixture, list):
        return dumped
    return {**dumped, "mixture": [{k: v for k, v in m.items() if k != "root"} if isinstance(m, dict) else m
                                  for m in mixture]}
