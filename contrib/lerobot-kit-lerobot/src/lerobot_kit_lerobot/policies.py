"""The LeRobot policies the bridge registers, as ``lerobot_<type>``: LeRobot's type name ->
the bridge's ``Policy`` class in ``lerobot_kit_lerobot.modeling``.

Torch-free (the hook module reads it). The README's status table says why each other
LeRobot 0.6 policy is not here.
"""

from __future__ import annotations

PREFIX = "lerobot_"

BRIDGED: dict[str, str] = {
    "act": "LerobotACT",
    "diffusion": "LerobotDiffusion",
    "pi0": "LerobotPI0",
    "pi05": "LerobotPI05",
    "smolvla": "LerobotSmolVLA",
}


def registered_name(lerobot_type: str) -> str:
    return PREFIX + lerobot_type
