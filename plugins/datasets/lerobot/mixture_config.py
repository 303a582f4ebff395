"""``--dataset.mixture``: the members of a mixture of LeRobot datasets, validated one by one.

The flag takes a JSON list or the path of a ``.json`` file holding one; either way the
run records the list itself in ``train_config.json``, so a resume reads the mixture it
trained on even if the file changed. Every problem is one line naming the member (its
position and ``repo_id``) and the fix. Torch-free and pyarrow-free, like the plugin's
config.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lerobot_kit.api import UnusableJson, decode_json, read_json_file


class MemberConfig(BaseModel):
    """One member: where the dataset is, how much of the samples it gets, how its keys map."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    repo_id: str = Field(description="LeRobot-format dataset id (user/name).")
    root: str | None = Field(None, description="Local folder of the dataset (else the Hugging Face cache).")
    revision: str | None = Field(None, description="Hub revision to read from the cache or download.")
    weight: float | None = Field(
        None, description="Relative share of the samples; unset: by frames (or frames**mixture_alpha)."
    )
    rename_map: dict[str, str] = Field(
        default_factory=dict, description="The member's feature names mapped onto the policy's."
    )
    episodes: list[int] | None = Field(None, description="Load only these episode indices of the member.")


def parse_mixture(value: Any) -> list[dict[str, Any]]:
    """The members of ``value`` (a JSON list, its text, or a path to a file holding it) as
    plain dicts, each validated; otherwise a ``ValueError`` naming the first problem (the
    member and the fix) and how many more there are."""
    members = _as_list(value)
    if not members:
        raise ValueError("the mixture is an empty list; give at least one member {\"repo_id\": \"user/name\"}")
    problems: list[str] = []
    parsed: list[MemberConfig] = []
    for position, raw in enumerate(members):
        label = _label(position, raw)
        if not isinstance(raw, dict):
            problems.append(f"{label} is {_json_type(raw)}, not an object such as {{\"repo_id\": \"user/name\"}}")
            continue
        try:
            member = MemberConfig.model_validate(raw)
        except ValidationError as exc:
            problems.extend(f"{label}: {_field_problem(err)}" for err in exc.errors())
            continue
        problems.extend(f"{label}: {p}" for p in _member_problems(member))
        parsed.append(member)
    if not problems:
        problems.extend(_mixture_problems(parsed))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(problems[0] + more)
    return [member.model_dump() for member in parsed]


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{")):
            try:
                value = decode_json(text)
            except UnusableJson as exc:
                raise ValueError(f"the mixture looks like JSON but is unusable: {exc}") from exc
        else:
            try:
                value = read_json_file(Path(text))
            except UnusableJson as exc:
                raise ValueError(
                    f"{text}: {exc}; give the mixture as a JSON list or the path of a .json file holding one"
                ) from exc
    if not isinstance(value, list):
        raise ValueError(
            f"the mixture must be a JSON list of members, got {_json_type(value)}; "
            "write [{\"repo_id\": \"user/a\"}, {\"repo_id\": \"user/b\", \"weight\": 2}]"
        )
    return value


def _label(position: int, raw: Any) -> str:
    repo_id = raw.get("repo_id") if isinstance(raw, dict) else None
    return f"mixture member {position}" + (f" ({repo_id})" if isinstance(repo_id, str) else "")


def _field_problem(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown field {where!r} (a member has repo_id, root, revision, weight, rename_map, episodes)"
    if err["type"] == "missing":
        return f"{where} is missing; every member names its dataset as \"repo_id\": \"user/name\""
    return f"{where}: {err['msg']} (got {err.get('input')!r})"


def _member_problems(member: MemberConfig) -> list[str]:
    problems = []
    owner, sep, name = member.repo_id.partition("/")
    if not sep or not owner or not name or "/" in name:
        problems.append(f"repo_id {member.repo_id!r} is not a Hugging Face dataset id of the form user/name")
    if member.weight is not None and not (math.isfinite(member.weight) and member.weight >= 0):
        problems.append(f"weight {member.weight} is negative; give a weight >= 0 (a relative share of the samples)")
    for source, target in member.rename_map.items():
        if not source or not target:
            problems.append(f"rename_map {source!r} -> {target!r}: both names must be non-empty feature keys")
    targets = list(member.rename_map.values())
    doubled = sorted({t for t in targets if targets.count(t) > 1})
    if doubled:
        problems.append(f"rename_map maps several keys onto {doubled}; each policy key can come from one key")
    if member.episodes is not None:
        if not member.episodes:
            problems.append("episodes is an empty list, which selects no data; leave it out to load every episode")
        elif min(member.episodes) < 0:
            problems.append(f"episodes are indices >= 0, got {member.episodes}")
    return problems


def _mixture_problems(members: list[MemberConfig]) -> list[str]:
    problems = []
    seen: dict[str, int] = {}
    for position, member in enumerate(members):
        if member.repo_id in seen:
            problems.append(
                f"mixture member {position} ({member.repo_id}) repeats member {seen[member.repo_id]}; each dataset "
                "is listed once (raise its weight to sample it more)"
            )
        seen.setdefault(member.repo_id, position)
    weighted = [m.weight is not None for m in members]
    if any(weighted) and not all(weighted):
        unweighted = [f"{p} ({m.repo_id})" for p, m in enumerate(members) if m.weight is None]
        problems.append(
            f"some members have a weight and others not ({', '.join(unweighted[:5])} have none); give every "
            "member a weight, or none (then shares follow frame counts)"
        )
    elif all(weighted) and sum(m.weight or 0.0 for m in members) <= 0:
        problems.append("the members' weights sum to 0, so no member would be sampled; give some a weight > 0")
    return problems


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
