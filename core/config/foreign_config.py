"""What to do about a checkpoint's ``config.json`` that its policy type refuses.

Usually the file is damaged, or a newer or older lerobot-kit wrote it. But a LeRobot user's
first command is often ``--policy.path=<a folder lerobot-train wrote>``: LeRobot's
``config.json`` names the same types (``act``, ``diffusion``) with LeRobot's fields, so
without the LeRobot bridge, whose types claim such files, lerobot-kit's own type refuses
it field by field. Nothing is damaged then; the bridge is missing, and the error says so.
LeRobot's configs are told apart by the features they record, which lerobot-kit's do not.
"""

from __future__ import annotations

from typing import Any

DAMAGED = "the checkpoint is damaged or was written by another version"


def written_by_lerobot(saved: Any) -> bool:
    return isinstance(saved, dict) and "input_features" in saved and "output_features" in saved


def refused_config_advice(saved: Any) -> str:
    """The end of the one line that refuses ``saved`` (a parsed ``config.json``)."""
    if not written_by_lerobot(saved):
        return DAMAGED
    return (
        f"LeRobot wrote it (it records input_features and output_features): install the LeRobot bridge "
        f"(lerobot-kit-lerobot, in contrib/ of lerobot-kit's source; Python >= 3.12) to read it as "
        f"--policy.type=lerobot_{saved.get('type')}"
    )
