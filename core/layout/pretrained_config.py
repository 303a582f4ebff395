"""A checkpoint's ``config.json`` validated as ``--policy.path`` validates it, for every reader.

``inspect-checkpoint``, a resume, ``--policy.path``, ``lerobot eval`` and
``load_pretrained`` all pass a checkpoint through ``core.layout.validate`` before reading
it, which asks here whether its ``config.json`` is a config its policy type builds: the
installed type's config class validates it, field by field, or, for a file another
library wrote (LeRobot's), the type that claims it validates it the way ``--policy.path``
hands it over (the folder, read by that type). So "loadable" and "resumable" mean the
same in all of them, and the line naming the problem is the same line.

A policy type that is not installed cannot tell, and is not a problem here: loading
says so when it needs the type.

A type whose check imports torch (``PolicyConfig.validation_imports_torch``: the LeRobot
bridge builds LeRobot's config and its policy on the meta device) is checked in a child
process when this one has not imported torch: ``inspect-checkpoint`` stays torch-free and
fast to start, and gives the verdict the other readers give in their own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lerobot_kit.core.errors import LerobotError
from lerobot_kit.core.layout.foreign_config import lerobot_config_advice
from lerobot_kit.core.layout.validation_lines import file_line


@dataclass(frozen=True)
class ConfigProblem:
    """Why ``config.json`` does not validate (without the file name); ``damage`` False when it
    is not damage but a file of another library that no installed type reads, whose line
    then ends with what to do."""

    line: str
    damage: bool = True


# A check in a child process builds a policy on the meta device: seconds, minutes for none.
CHILD_CHECK_TIMEOUT_S = 600


def pretrained_config_problem(folder: Path, saved: dict[str, Any], *, here: bool = False) -> ConfigProblem | None:
    """The problem of ``saved``, the parsed ``config.json`` of the loadable ``folder``; None
    when its policy type accepts it, or when no installed type can tell. ``here``: check in
    this process whatever the type imports."""
    from lerobot_kit.core.registry.registry import get_registry

    registry = get_registry()
    claimed = registry.claiming_policy_type(saved)
    policy_type = claimed or saved.get("type")
    try:
        config_class = registry.policy(str(policy_type)).config_class
    except LerobotError:
        return None
    if not here and getattr(config_class, "validation_imports_torch", False) and "torch" not in sys.modules:
        return problem_in_child(folder, saved)
    given = {"path": str(folder), "type": claimed} if claimed else saved
    try:
        validated = config_class.model_validate(given)
    except ValidationError as err:
        line = f"not a valid {policy_type!r} config: {file_line(err.errors())}"
        advice = None if claimed else lerobot_config_advice(saved)
        return ConfigProblem(f"{line}: {advice}", damage=False) if advice else ConfigProblem(line)
    # A type may check the rest of the folder against the config (the LeRobot bridge: that the
    # weights are the model the config describes), in the same words for every reader.
    folder_problem = getattr(validated, "pretrained_problem", None)
    line = folder_problem(folder) if callable(folder_problem) else None
    return ConfigProblem(line) if line else None


def problem_in_child(folder: Path, saved: dict[str, Any]) -> ConfigProblem | None:
    """``pretrained_config_problem`` run by ``python -m lerobot_kit.core.layout.pretrained_config``,
    the parsed config handed over on stdin (the file is read once, by the caller's checks)."""
    request = json.dumps({"folder": str(folder), "saved": saved})
    command = [sys.executable, "-m", "lerobot_kit.core.layout.pretrained_config"]
    try:
        done = subprocess.run(command, input=request, capture_output=True, text=True,
                              timeout=CHILD_CHECK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LerobotError(
            f"{folder}: checking config.json against its policy type took over {CHILD_CHECK_TIMEOUT_S} s "
            "in a child process; load the folder with --policy.path to see where it stops"
        ) from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise LerobotError(f"{folder}: checking config.json against its policy type failed in a child process: {last}")
    answer = json.loads(done.stdout)
    return None if answer is None else ConfigProblem(**answer)


def _answer_request() -> None:
    request = json.loads(sys.stdin.read())
    found = pretrained_config_problem(Path(request["folder"]), request["saved"], here=True)
    print(json.dumps(None if found is None else asdict(found)))


if __name__ == "__main__":
    _answer_request()
