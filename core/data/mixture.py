"""Several datasets trained on as one: a ``PolicyDataset`` whose index space lays its members
end to end, so the samplers, the loader, resume, ``lerobot plan`` and evaluation see one
dataset, and the samplers draw each member's share (``member_shares``).

Members keep their own frame rate (a policy's frame offsets are frames of the member's
own clock), their own task texts and episodes. What a policy sees is their union:

- ``rename_map`` maps a member's feature names onto the policy's, so cameras recorded
  under other names (``cam_high``, ``top``) meet in one slot;
- cameras: every camera of any member; a member without one hands a black placeholder of
  that camera's shape, flagged per sample by ``missing_key(camera)``, to policies that
  declare ``accepts_missing_cameras`` (they mask it out); others are refused such a
  mixture, naming the member and the camera;
- vectors (state, action, any 1-D float feature every member has): the widest member's
  width, narrower members zero-padded at the end, for policies that declare
  ``pads_vectors``; others are refused members of different widths;
- other features: those every member has, with one shape;
- statistics: those of the members' frames laid end to end (``mixture_stats``).

Each item carries ``MEMBER_KEY`` (for per-member metrics) and, as ``INDEX_KEY``, its index
in the mixture: randomness keyed by ``(seed, epoch, index)`` (augmentation, a policy's
noise) is then distinct across members and the same on any layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lerobot_kit.core.data.dataset import (
    ACTION_KEY,
    INDEX_KEY,
    MEMBER_KEY,
    STATE_KEY,
    DatasetMeta,
    FeatureSpec,
    PolicyDataset,
    missing_key,
    pad_key,
)
from lerobot_kit.core.data.mixture_stats import aggregate_stats
from lerobot_kit.core.data.windows import expand_delta_indices
from lerobot_kit.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

TASK_KEY = "task"
PAD_SUFFIX = pad_key("")
# Kept from a member's items whatever its features: where the sample comes from, and its text.
ITEM_FACTS = ("episode_index", TASK_KEY)
REQUIRED_IN_EVERY_MEMBER = (ACTION_KEY, STATE_KEY)


@dataclass(frozen=True)
class MixtureMember:
    """A dataset in a mixture: its name (a LeRobot member's ``repo_id``), its items, the
    renames of its keys onto the policy's and its weight (None: by frames)."""

    name: str
    dataset: PolicyDataset
    rename: dict[str, str] = field(default_factory=dict)
    weight: float | None = None

    def features(self) -> dict[str, FeatureSpec]:
        """The member's features under the policy's names."""
        return {self.rename.get(key, key): spec for key, spec in self.dataset.meta.features.items()}


def member_delta_indices(
    delta_indices: dict[str, list[int]], rename: dict[str, str], member_keys: list[str]
) -> dict[str, list[int]]:
    """The frame offsets a policy asks for, in a member's own names: a named feature under its
    member name; a camera the member lacks left out (the mixture hands a placeholder)."""
    inverse = {target: source for source, target in rename.items()}
    out = {}
    for key, offsets in delta_indices.items():
        own = inverse.get(key, key)
        if own in member_keys or "*" in key or not key.startswith("observation.images."):
            out[own] = offsets
    return out


class MixtureDataset(PolicyDataset):
    """Members laid end to end in one index space; see the module doc for what items hold."""

    def __init__(self, members: list[MixtureMember], delta_indices: dict[str, list[int]], alpha: float = 1.0) -> None:
        check_members(members)
        self.members = members
        self.names = [member.name for member in members]
        frames = np.array([len(member.dataset) for member in members], dtype=np.int64)
        self.frames = frames
        self.starts = np.concatenate([[0], np.cumsum(frames)]).astype(np.int64)
        self.shares = member_shares(members, frames, alpha)
        features, self.widths = union_features(members)
        self.missing = [sorted(k for k, f in features.items() if f.is_image and k not in m.features())
                        for m in members]
        self.flagged = sorted({camera for cameras in self.missing for camera in cameras})
        offsets = expand_delta_indices(delta_indices, {k: f.is_image for k, f in features.items()})
        self.placeholder_frames = {camera: len(offsets[camera]) if camera in offsets else None
                                   for camera in self.flagged}
        self.has_tasks = any(_has_tasks(member.dataset) for member in members)
        self.meta = DatasetMeta(
            features=features,
            stats=mixture_stats(members, features, frames),
            fps=members[0].dataset.meta.fps,
            num_episodes=sum(member.dataset.meta.num_episodes for member in members),
            num_frames=int(frames.sum()),
        )
        self.reads_on_demand = any(member.dataset.reads_on_demand for member in members)
        self._item_names: list[dict[str, str | None]] = [{} for _ in members]  # per member: item key -> policy key

    def __len__(self) -> int:
        return int(self.starts[-1])

    def member_names(self) -> list[str]:
        return list(self.names)

    def member_frames(self) -> np.ndarray:
        return self.frames.copy()

    def member_shares(self) -> np.ndarray:
        return self.shares.copy()

    def episode_lengths(self) -> np.ndarray:
        return np.concatenate([member.dataset.episode_lengths() for member in self.members]).astype(np.int64)

    def locate(self, i: int) -> tuple[int, int]:
        """``(member, index in the member)`` of mixture index ``i``."""
        members, local = self._locate([i])
        return int(members[0]), int(local[0])

    def _locate(self, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each index's member and index in that member, all at once."""
        n = len(self)
        positions = np.asarray(indices, dtype=np.int64)
        outside = (positions < -n) | (positions >= n)
        if outside.any():
            raise IndexError(f"sample {int(positions[outside][0])} out of range for a mixture of {n} frames")
        positions = positions % n
        members = np.searchsorted(self.starts, positions, side="right") - 1
        return members, positions - self.starts[members]

    def item(self, i: int, *, uint8_cameras: bool = False) -> dict[str, torch.Tensor]:
        return self.items([i], uint8_cameras=uint8_cameras)[0]

    def items(self, indices: list[int], *, uint8_cameras: bool = False) -> list[dict[str, torch.Tensor]]:
        """The members' items read together, each dataset type's at once (its ``items_across``),
        then put in the policy's terms."""
        import torch

        members, local = self._locate(indices)
        by_member: dict[int, list[int]] = {}
        for slot, member in enumerate(members.tolist()):
            by_member.setdefault(member, []).append(slot)
        # Views of one tensor each: a tensor apiece costs more than the rest of a small item's reshaping.
        member_tensors = torch.from_numpy(members).unbind()
        index_tensors = torch.from_numpy(local + self.starts[members]).unbind()
        out: list[dict[str, Any]] = [{} for _ in indices]
        by_type: dict[type[PolicyDataset], list[int]] = {}
        for member in by_member:
            by_type.setdefault(type(self.members[member].dataset), []).append(member)
        for kind, members_of_kind in by_type.items():
            requests = [(self.members[m].dataset, local[by_member[m]].tolist()) for m in members_of_kind]
            if _reads_items(kind):
                read = kind.items_across(requests, uint8_cameras=uint8_cameras)
            else:
                read = [[dataset[i] for i in wanted] for dataset, wanted in requests]
            for member, member_items in zip(members_of_kind, read):
                for slot, item in zip(by_member[member], member_items):
                    out[slot] = self._as_policy_item(member, item, uint8_cameras)
                    out[slot][MEMBER_KEY] = member_tensors[slot]
                    out[slot][INDEX_KEY] = index_tensors[slot]
        return out

    def _as_policy_item(self, member: int, item: dict[str, Any], uint8_cameras: bool) -> dict[str, Any]:
        """A member's item in the policy's terms, but for its member and index."""
        import torch

        features = self.meta.features
        names = self._item_names[member]
        out: dict[str, Any] = {}
        for key, value in item.items():
            if key not in names:
                names[key] = self._policy_name(member, key)
            name = names[key]
            if name is not None:
                out[name] = value
        for key, width in self.widths[member].items():
            wanted = features[key].shape[0]
            if width < wanted:
                out[key] = torch.nn.functional.pad(out[key], (0, wanted - width))
        for camera in self.missing[member]:
            steps = self.placeholder_frames[camera]
            shape = features[camera].shape if steps is None else (steps, *features[camera].shape)
            out[camera] = torch.zeros(shape, dtype=torch.uint8 if uint8_cameras else torch.float32)
            if steps is not None:
                out[pad_key(camera)] = torch.ones(steps, dtype=torch.bool)
        for camera in self.flagged:
            out[missing_key(camera)] = torch.tensor(camera in self.missing[member])
        if self.has_tasks and TASK_KEY not in out:
            out[TASK_KEY] = ""
        return out

    def _policy_name(self, member: int, key: str) -> str | None:
        """The key a member's item key has in the policy's items, None if left out (worked out
        once per member and key: a mixture reads each member's keys over and over)."""
        base, is_pad = (key[: -len(PAD_SUFFIX)], True) if key.endswith(PAD_SUFFIX) else (key, False)
        name = self.members[member].rename.get(base, base)
        if name in self.meta.features:
            return pad_key(name) if is_pad else name
        return key if key in ITEM_FACTS else None

    def check_policy(self, policy_type: str, accepts_missing_cameras: bool, pads_vectors: bool) -> None:
        """Refuse, in one line naming members, what the policy cannot take: a camera some member
        lacks, or vectors of different widths, for a policy that does not declare it handles them."""
        if not accepts_missing_cameras:
            for member, cameras in zip(self.members, self.missing):
                if cameras:
                    raise ConfigError(
                        f"mixture member {member.name} has no camera {cameras[0]!r}, which other members have, and "
                        f"policy.type={policy_type} needs every camera in every sample: map one of its cameras "
                        f"onto it with \"rename_map\", leave the camera out of the other members, or train a policy "
                        "that accepts missing cameras (lerobot_pi0, lerobot_pi05, lerobot_smolvla)"
                    )
        if not pads_vectors:
            for key, spec in self.meta.features.items():
                narrower = [(m.name, w[key]) for m, w in zip(self.members, self.widths) if w.get(key, spec.shape[0])
                            != spec.shape[0]]
                if narrower:
                    widest = next(m.name for m, w in zip(self.members, self.widths) if w.get(key) == spec.shape[0])
                    shown = ", ".join(f"{name}: {width}" for name, width in narrower[:3])
                    raise ConfigError(
                        f"mixture members differ in the width of {key!r} ({widest}: {spec.shape[0]}, {shown}), and "
                        f"policy.type={policy_type} does not pad vectors: mix datasets of one robot layout, or "
                        "train a policy that pads them (lerobot_pi0, lerobot_pi05, lerobot_smolvla)"
                    )


def _reads_items(kind: type[PolicyDataset]) -> bool:
    """Whether a dataset type reads items itself (else only ``__getitem__`` is its own)."""
    return kind.item is not PolicyDataset.item


def _has_tasks(dataset: PolicyDataset) -> bool:
    return bool(getattr(dataset, "tasks", None))


def member_shares(members: list[MixtureMember], frames: np.ndarray, alpha: float) -> np.ndarray:
    """Each member's fraction of the samples: its weight over the sum of weights, else its
    frames**alpha over the sum of those."""
    if members[0].weight is not None:
        raw = np.array([member.weight for member in members], dtype=np.float64)
    else:
        raw = frames.astype(np.float64) ** alpha
    return raw / raw.sum()


def check_members(members: list[MixtureMember]) -> None:
    """Renames that name a feature the member has and land on a free name; no empty member."""
    if not members:
        raise ConfigError("a mixture needs at least one member")
    for member in members:
        keys = set(member.dataset.meta.features)
        for source, target in member.rename.items():
            if source not in keys:
                raise ConfigError(
                    f"mixture member {member.name}: rename_map renames {source!r}, which the member lacks (it has "
                    f"{sorted(keys)}); fix the key or remove it from rename_map"
                )
            if target in keys and target not in member.rename:
                raise ConfigError(
                    f"mixture member {member.name}: rename_map renames {source!r} onto {target!r}, which the member "
                    f"already has; rename {target!r} too, or pick another name"
                )
        if len(member.dataset) == 0:
            raise ConfigError(f"mixture member {member.name} has no frames; remove it from the mixture")


def union_features(members: list[MixtureMember]) -> tuple[dict[str, FeatureSpec], list[dict[str, int]]]:
    """The policy's features, and per member the width of each vector it holds (when its
    width is not the mixture's, it is zero-padded up to it)."""
    renamed = [member.features() for member in members]
    for key in REQUIRED_IN_EVERY_MEMBER:
        holders = [m.name for m, f in zip(members, renamed) if key in f]
        if holders and len(holders) < len(members):
            lacking = next(m.name for m, f in zip(members, renamed) if key not in f)
            raise ConfigError(
                f"mixture member {lacking} has no {key!r}, which {holders[0]} has; every member needs it "
                "(map the member's own name onto it with \"rename_map\", or leave the member out)"
            )
    cameras: dict[str, tuple[str, FeatureSpec]] = {}
    for member, features in zip(members, renamed):
        for key, spec in features.items():
            if not spec.is_image:
                continue
            first = cameras.setdefault(key, (member.name, spec))
            if first[1].shape != spec.shape:
                raise ConfigError(
                    f"mixture members {first[0]} and {member.name} both have camera {key!r}, of shapes "
                    f"{list(first[1].shape)} and {list(spec.shape)}; a batch needs one shape per camera: map one of "
                    "them onto another name with \"rename_map\", or re-encode the videos to one size"
                )
    union = {key: spec for key, (_, spec) in cameras.items()}
    shared = [k for k in renamed[0] if not renamed[0][k].is_image and all(k in f for f in renamed[1:])]
    widths: list[dict[str, int]] = [{} for _ in members]
    for key in shared:
        specs = [features[key] for features in renamed]
        if all(spec.shape == specs[0].shape for spec in specs):
            union[key] = specs[0]
            continue
        if not all(spec.dtype == "float32" and len(spec.shape) == 1 for spec in specs):
            shapes = ", ".join(f"{m.name}: {list(s.shape)}" for m, s in zip(members, specs))
            raise ConfigError(
                f"mixture members hold {key!r} in shapes that cannot be padded to one ({shapes}); leave the "
                "feature out of some members with \"rename_map\" or mix datasets of one layout"
            )
        widest = max(specs, key=lambda spec: spec.shape[0])
        union[key] = widest
        for position, spec in enumerate(specs):
            widths[position][key] = spec.shape[0]
    return union, widths


def mixture_stats(
    members: list[MixtureMember], features: dict[str, FeatureSpec], frames: np.ndarray
) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of every feature some member has statistics for (``mixture_stats``)."""
    renamed = [{member.rename.get(k, k): s for k, s in member.dataset.meta.stats.items()} for member in members]
    out = {}
    for key, spec in features.items():
        parts = [(count, own[key]) for own, count in zip(renamed, frames.tolist()) if own.get(key)]
        if parts:
            shape = np.asarray(parts[0][1]["mean"]).shape if spec.is_image and "mean" in parts[0][1] else spec.shape
            out[key] = aggregate_stats(parts, shape)
    return out
