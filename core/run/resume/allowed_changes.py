"""What a resumed run may change: every flag on resume takes effect or is refused by name.

A resume rebuilds the run from its flags (or ``--config_path``) and then restores the
checkpoint's weights, optimizer, schedule, data position and RNG over it. Settings the
restored state was made for cannot change without the run silently training something
else, so they are compared with the checkpoint's ``train_config.json`` and a change is
one error line naming the flag and the fix:

- the policy (type and architecture; ``PolicyConfig.resume_may_change`` excepted, i.e.
  where the result is published; compared as ``PolicyConfig.resume_views`` shows it):
  the weights were trained as that model;
- the dataset (``DatasetConfig.resume_may_change`` excepted: where the data lives, the
  augmentation): the restored data position indexes that data;
- ``peft``: the checkpoint holds the adapter of those settings;
- ``seed``: the data order and the restored RNG streams derive from it;
- ``output_dir``: a resumed run continues in its own folder.

Everything else takes effect: the optimizer's hyperparameters are applied over the
restored state (``resume.optimizer_flags``), the schedule is rebuilt from the flags at the restored
step, and the topology, batch size, steps, saving, logging and evaluation are the new
run's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lerobot_kit.core.config.schema import TrainConfig
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.json_file import read_json

NEW_RUN = "or start a new run in another --output_dir (--policy.path=<this step folder> starts it from these weights)"


def check_resume_changes(config: TrainConfig, step_dir: Path, output_dir: Path, peft_base: Path | None) -> None:
    """Refuse, in one ``ConfigError`` (a line per rule broken), what ``config`` changes that a resume cannot."""
    recorded = _recorded_config(step_dir)
    if recorded is None:
        return
    new = config.to_json_dict()
    problems = [
        *_policy_changes(config, new, recorded, peft_base),
        *_fixed(*_dataset_views(config, new, recorded), "dataset", config.dataset.resume_may_change,
                "the dataset cannot change on resume (the restored data position indexes that data)"),
        *_fixed(new, recorded, "peft", frozenset(), "PEFT settings cannot change on resume (the checkpoint holds "
                "the adapter they describe)"),
        *_fixed_field(new, recorded, "seed", "the seed cannot change on resume (the data order and the restored "
                      "random streams derive from it)"),
    ]
    if config.output_dir is not None and config.output_dir != recorded.get("output_dir"):
        if Path(config.output_dir).resolve() != output_dir.resolve():
            problems.append(
                f"--output_dir={config.output_dir} differs from the folder of the run being resumed ({output_dir}); "
                f"a resumed run continues in its own folder: remove --output_dir, {NEW_RUN}"
            )
    if problems and config.config_path is None:
        problems.append(
            "(flags not given take their defaults, not the run's: to resume with the run's own settings, pass "
            f"--config_path={step_dir / paths.PRETRAINED_DIR / paths.TRAIN_CONFIG} and only the flags to change)"
        )
    if problems:
        raise ConfigError("\n".join(problems))


def _dataset_views(config: TrainConfig, new: dict[str, Any],
                   recorded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both configs with their dataset sections as the dataset type compares them on resume."""
    old = recorded.get("dataset")
    if not isinstance(old, dict):
        return new, recorded
    new_view, old_view = type(config.dataset).resume_views(new["dataset"], old)
    return {**new, "dataset": new_view}, {**recorded, "dataset": old_view}


def _recorded_config(step_dir: Path) -> dict[str, Any] | None:
    """The checkpoint's ``train_config.json``; None for a step folder written without one."""
    file = step_dir / paths.PRETRAINED_DIR / paths.TRAIN_CONFIG
    if not file.is_file():
        return None
    recorded = read_json(file, "the checkpoint is damaged")
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{file}: not a JSON object; the checkpoint is damaged")
    return recorded


def _policy_changes(config: TrainConfig, new: dict[str, Any], recorded: dict[str, Any],
                    peft_base: Path | None) -> list[str]:
    old = recorded.get("policy")
    if not isinstance(old, dict):
        return []
    if "type" in old and old["type"] != config.policy.type:
        return [
            f"--policy.type={config.policy.type} differs from the checkpoint's {old['type']}; the policy type "
            f"cannot change on resume (the checkpoint holds {old['type']} weights): remove --policy.type, "
            "or start a new run in another --output_dir"
        ]
    given = str(peft_base) if peft_base is not None else new["policy"].get("path")
    new_policy = {**new["policy"], "path": given}
    if _same_path(given, old.get("path")):
        new_policy["path"] = old.get("path")
    new_policy, old = type(config.policy).resume_views(new_policy, old)
    return _fixed({"policy": new_policy}, {**recorded, "policy": old}, "policy", config.policy.resume_may_change,
                  "the policy cannot change on resume (the checkpoint's weights were trained as that model)")


def _same_path(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, str) and isinstance(b, str) and Path(a).resolve() == Path(b).resolve())


def _fixed(new: dict[str, Any], recorded: dict[str, Any], section: str, may_change: frozenset[str],
           why: str) -> list[str]:
    """One line for the fields of ``section`` (outside ``may_change``) that differ from the checkpoint's."""
    old = recorded.get(section)
    if not isinstance(old, dict):
        return []
    changed = [
        (flag, value, before)
        for flag, value, before in _differences(new[section], old, section)
        if flag.split(".")[1] not in may_change
    ]
    return [_line(changed, why)] if changed else []


def _fixed_field(new: dict[str, Any], recorded: dict[str, Any], field: str, why: str) -> list[str]:
    if field in recorded and recorded[field] != new[field]:
        return [_line([(field, new[field], recorded[field])], why)]
    return []


def _differences(new: Any, old: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """``(dotted field, new value, checkpoint's value)`` for each field both hold with different values."""
    if isinstance(new, dict) and isinstance(old, dict):
        return [d for key in new if key in old for d in _differences(new[key], old[key], f"{prefix}.{key}")]
    return [] if new == old else [(prefix, new, old)]


def _line(changed: list[tuple[str, Any, Any]], why: str) -> str:
    shown = ", ".join(f"--{flag}={_show(value)} (checkpoint: {_show(before)})" for flag, value, before in changed)
    verb = "differs" if len(changed) == 1 else "differ"
    return f"{shown} {verb} from the checkpoint being resumed; {why}: remove the flag to resume, {NEW_RUN}"


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
