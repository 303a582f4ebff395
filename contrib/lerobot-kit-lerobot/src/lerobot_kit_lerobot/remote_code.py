"""No tokenizer, processor or VLM folder the bridge has LeRobot load ever runs code of its own.

transformers runs a folder's Python files when one of its configs names classes in them
(``auto_map``) and its loader is told to trust remote code. LeRobot's loaders pass no
decision (``AutoTokenizer.from_pretrained(name)``), and then transformers decides itself:
where it has a class of its own for the folder it uses that; where not, it asks "Do you
wish to run the custom code? [y/N]" on a terminal in the middle of a run, and a "y" runs
the folder's file; without a terminal it fails with advice to pass
``trust_remote_code=True``.

Inside ``no_remote_code`` every such decision is "no" (``trust_remote_code=False``),
whatever the caller passed: a folder transformers can load with its own classes loads
with them, and one that only its own code could load is refused in one line naming the
flag and the config that asks for code, before any of it is imported, terminal or not.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lerobot_kit.api import ConfigError, NotRegularFile, open_regular
from lerobot_kit_lerobot.pi_overrides import replaced

# transformers' loaders that decide on remote code, each with its own import of the decision.
LOADER_MODULES = (
    "transformers.dynamic_module_utils",
    "transformers.models.auto.auto_factory",
    "transformers.models.auto.configuration_auto",
    "transformers.models.auto.feature_extraction_auto",
    "transformers.models.auto.image_processing_auto",
    "transformers.models.auto.processing_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.auto.video_processing_auto",
)


class RemoteCodeRefused(ConfigError):
    """A folder that only its own code could load."""


def configs_asking_for_code(folder: Path) -> dict[str, Any]:
    """The ``*config.json`` files of a local folder that name code of the folder's own
    (their ``auto_map``), by file name."""
    asking: dict[str, Any] = {}
    for file in sorted(folder.glob("*config.json")) if folder.is_dir() else []:
        try:
            with open_regular(file) as opened:  # a named pipe there would block a plain open
                content = json.loads(opened.read().decode("utf-8"))
        except (OSError, NotRegularFile, UnicodeDecodeError, json.JSONDecodeError):
            continue  # the folder's check (``folder_files``) names a file that cannot be read
        if isinstance(content, dict) and content.get("auto_map"):
            asking[file.name] = content["auto_map"]
    return asking


def refusal(flag: str, name: str) -> str:
    asking = configs_asking_for_code(Path(name))
    where = "; ".join(f"{file} has auto_map {json.dumps(entry)}" for file, entry in asking.items())
    return (
        f"{flag}: {name} can only be loaded by running code of its own ({where or 'its config has an auto_map'}), "
        "and lerobot-kit never runs a model folder's code: give a folder that transformers loads with its own "
        "classes (a 'tokenizer_class' / 'model_type' transformers has, no auto_map)"
    )


@contextlib.contextmanager
def no_remote_code(flag: str) -> Iterator[None]:
    """transformers trusts no remote code inside this block; a folder that needs it is a
    ``RemoteCodeRefused`` naming ``flag`` (the flag and value that named the folder)."""

    def never_trust(trust_remote_code: Any, model_name: str, has_local_code: bool, has_remote_code: bool,
                    *args: Any, **kwargs: Any) -> bool:
        if has_remote_code and not has_local_code:
            raise RemoteCodeRefused(refusal(flag, str(model_name)))
        return False

    def never_import(class_reference: str, name: str, *args: Any, **kwargs: Any) -> Any:
        raise RemoteCodeRefused(refusal(flag, str(name)))

    with contextlib.ExitStack() as stack:
        for module_name in LOADER_MODULES:
            module = importlib.import_module(module_name)
            names = {name: replacement for name, replacement in (
                ("resolve_trust_remote_code", never_trust), ("get_class_from_dynamic_module", never_import),
            ) if hasattr(module, name)}
            stack.enter_context(replaced(module, names))
        yield
