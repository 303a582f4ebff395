"""SmolVLA's default VLM, ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct``, built from an
architecture the bridge ships, so that LeRobot's SmolVLA builds at its full size with
nothing downloaded (``lerobot plan`` on a machine without the hub, on the meta device).

For a fresh model (``load_vlm_weights=false``, LeRobot's default) LeRobot's
``SmolVLMWithExpertModel`` takes two things from the hub: the VLM's ``config.json``
(``AutoConfig.from_pretrained``), whose architecture it builds with random weights, and
its processor (``AutoProcessor.from_pretrained``), of which ``VLAFlowMatching`` reads only
the ids of two image tokens of the tokenizer. ``smolvlm2_500m_video_instruct.json`` holds
both: the architecture fields of that model's ``config.json`` (a SmolLM2-360M-like Llama
text model, a SigLIP base patch-16 vision tower at 512 px, pixel-shuffle scale 4, 49,280
tokens) and the ids of ``<global-img>`` and ``<fake_token_around_image>``.

Inside ``shipped_vlm`` LeRobot's constructor is handed these in place of the hub's files
when ``vlm_model_name`` is that hub id and no folder of that name exists; every module is
still built by LeRobot's and transformers' own code from the config. The tokenizer is not
shipped: LeRobot's processors still tokenize a run's task texts with the hub's (or a local
folder's, through ``--policy.vlm_model_name``), so training needs them; a plan does not.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lerobot_kit.api import ConfigError
from lerobot_kit_lerobot.pi_overrides import replaced

SHIPPED_FILE = Path(__file__).with_name("smolvlm2_500m_video_instruct.json")


@cache
def shipped() -> dict[str, Any]:
    """The shipped file: ``hub_id``, ``config`` (SmolVLMConfig's arguments), ``tokenizer`` (the image token ids)."""
    return json.loads(SHIPPED_FILE.read_text())


def uses_shipped(vlm_model_name: str, load_vlm_weights: bool) -> bool:
    """Whether LeRobot builds this VLM from the shipped architecture: the shipped hub id,
    named as such (not a local folder), and no pretrained weights to load (those need the hub)."""
    return not load_vlm_weights and vlm_model_name == shipped()["hub_id"] and not Path(vlm_model_name).is_dir()


def shipped_config() -> Any:
    """The VLM's ``SmolVLMConfig``, as ``AutoConfig.from_pretrained`` would give it from the hub."""
    from transformers import SmolVLMConfig

    return SmolVLMConfig(**shipped()["config"])


def check_smolvlm(vlm_model_name: str) -> None:
    """Refuse a VLM of another architecture in one line naming the flag: LeRobot's SmolVLA
    builds ``SmolVLMForConditionalGeneration`` from the config it loads and reads its
    ``text_config`` and vision model, so any other model fails inside its constructor (a
    bare ``AttributeError`` for a Llama's config)."""
    from transformers import AutoConfig

    model_type = getattr(AutoConfig.from_pretrained(vlm_model_name), "model_type", None)
    expected = shipped_config().model_type
    if model_type != expected:
        raise ConfigError(
            f"--policy.vlm_model_name={vlm_model_name}: its config.json describes a {model_type!r} model, and "
            f"LeRobot's SmolVLA is built on a SmolVLM ({expected!r}, such as {shipped()['hub_id']}): give the "
            "files of a SmolVLM"
        )


@contextlib.contextmanager
def shipped_vlm(vlm_model_name: str, load_vlm_weights: bool) -> Iterator[None]:
    """LeRobot's SmolVLA constructor, run inside this block, builds its VLM from the shipped
    architecture when ``uses_shipped``; otherwise it loads what it names, as LeRobot does,
    once ``check_smolvlm`` found a SmolVLM there."""
    if not uses_shipped(vlm_model_name, load_vlm_weights):
        check_smolvlm(vlm_model_name)
        yield
        return
    module = importlib.import_module("lerobot.policies.smolvla.smolvlm_with_expert")
    # What VLAFlowMatching reads of the processor: processor.tokenizer.<image token ids>.
    processor = SimpleNamespace(tokenizer=SimpleNamespace(**shipped()["tokenizer"]))
    replacements = {
        "AutoConfig": SimpleNamespace(from_pretrained=lambda model_id, **_: shipped_config()),
        "AutoProcessor": SimpleNamespace(from_pretrained=lambda model_id, **_: processor),
    }
    with replaced(module, replacements):
        yield
