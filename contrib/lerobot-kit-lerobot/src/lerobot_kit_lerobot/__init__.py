"""The plugin module named by the ``lerobot_kit`` entry point: LeRobot's policies as
``--policy.type=lerobot_<type>``.

``lerobot`` imports this module for every command, ``--help`` included, so it imports
neither torch nor LeRobot: the config classes come from the shipped ``schemas.json``,
and the policy classes are ``"module:attribute"`` strings imported when a run uses them.
"""

from __future__ import annotations

from typing import Callable

from lerobot_kit.api import hookimpl
from lerobot_kit_lerobot.configuration import CONFIG_CLASSES
from lerobot_kit_lerobot.policies import BRIDGED, registered_name


@hookimpl
def lerobot_register_policies(register: Callable[..., None]) -> None:
    for lerobot_type, class_name in BRIDGED.items():
        register(registered_name(lerobot_type), CONFIG_CLASSES[lerobot_type], f"lerobot_kit_lerobot.modeling:{class_name}")
