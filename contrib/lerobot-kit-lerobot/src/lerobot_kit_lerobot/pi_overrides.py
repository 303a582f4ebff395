"""``--policy.sizes`` and ``--policy.tokenizer_name`` applied to LeRobot's π0/π0.5 code.

LeRobot fixes both in code, not in its config: ``PI05Pytorch`` asks
``get_gemma_config(variant)`` for its towers' sizes, ``PaliGemmaWithExpertModel`` builds
SigLIP so400m and a 257,152-token vocabulary with literal numbers, and the processor
factory constructs ``TokenizerProcessorStep(tokenizer_name="google/paligemma-3b-pt-224")``.
Each context manager here replaces those names in LeRobot's module for the duration of
one call of LeRobot's own constructor or factory, then restores them, so every module,
processor step and file is still LeRobot's, built by LeRobot's code at other sizes or
with another tokenizer. LeRobot's ``from_pretrained`` builds a checkpoint of other sizes
the same way (``pi_sizes(...)`` around it), as the bridge's tests do.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from lerobot_kit.api import ConfigError
from lerobot_kit_lerobot.bridge_fields import PiSizes


@contextlib.contextmanager
def replaced(module: ModuleType, names: dict[str, Any]) -> Iterator[None]:
    """``module``'s ``names`` set to these values inside the block, restored after it."""
    original = {name: getattr(module, name) for name in names}
    for name, value in names.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in original.items():
            setattr(module, name, value)


def modeling_module(lerobot_type: str) -> ModuleType:
    return importlib.import_module(f"lerobot.policies.{lerobot_type}.modeling_{lerobot_type}")


@contextlib.contextmanager
def pi_sizes(lerobot_type: str, sizes: PiSizes | None) -> Iterator[None]:
    """LeRobot's ``lerobot_type`` (``pi0`` or ``pi05``) builds at ``sizes`` inside this block
    (at its own sizes when ``sizes`` is None)."""
    if sizes is None:
        yield
        return
    module = modeling_module(lerobot_type)
    gemma_config, paligemma_class, expert_class = (
        module.get_gemma_config, module.PaliGemmaForConditionalGenerationWithPiGemma, module.PiGemmaForCausalLM
    )

    def sized_gemma(variant: str) -> Any:
        size = getattr(sizes, variant, None)
        return module.GemmaConfig(**size.model_dump()) if size is not None else gemma_config(variant)

    def sized_paligemma(config: Any) -> Any:
        if sizes.vocab_size is not None:
            config.text_config.vocab_size = config._vocab_size = config.image_token_index = sizes.vocab_size
        if sizes.vision is not None:
            for name, value in sizes.vision.model_dump().items():
                setattr(config.vision_config, name, value)
        # The projector maps image features into the language width (LeRobot writes gemma_2b's 2048).
        config.vision_config.projection_dim = config.text_config.hidden_size
        return paligemma_class(config=config)

    def sized_expert(config: Any) -> Any:
        if sizes.vocab_size is not None:
            config.vocab_size = sizes.vocab_size
        return expert_class(config=config)

    replacements = {
        "get_gemma_config": sized_gemma,
        "PaliGemmaForConditionalGenerationWithPiGemma": sized_paligemma,
        "PiGemmaForCausalLM": sized_expert,
    }
    with replaced(module, replacements):
        yield


def check_joint_depths(lerobot_type: str, config: Any) -> None:
    """Refuse ``--policy.sizes`` whose VLM and action expert differ in depth: LeRobot's
    π0/π0.5 compute layer i of both as one joint attention (``compute_layer_complete``),
    so the deeper tower's last layers would have no partner (LeRobot fails on them with a
    bare ``zip()`` or index error)."""
    if config.sizes is None:
        return
    variants = {"VLM": config.paligemma_variant, "action expert": config.action_expert_variant}
    with pi_sizes(lerobot_type, config.sizes):
        get_config = modeling_module(lerobot_type).get_gemma_config
        depths = {role: get_config(variant).depth for role, variant in variants.items()}
    if len(set(depths.values())) > 1:
        towers = " and ".join(f"the {role} ({variants[role]}) {depth}" for role, depth in depths.items())
        raise ConfigError(
            f"--policy.sizes: {towers} layers deep, and LeRobot's {lerobot_type} runs layer i of both as one joint "
            "attention: give both towers one depth"
        )


@contextlib.contextmanager
def pi_tokenizer(lerobot_type: str, tokenizer_name: str) -> Iterator[None]:
    """LeRobot's processor factory for ``lerobot_type`` loads ``tokenizer_name`` inside this
    block, wherever its code names PaliGemma's hub tokenizer."""
    module = importlib.import_module(f"lerobot.policies.{lerobot_type}.processor_{lerobot_type}")
    step_class = module.TokenizerProcessorStep

    def step(**kwargs: Any) -> Any:
        return step_class(**{**kwargs, "tokenizer_name": tokenizer_name})

    with replaced(module, {"TokenizerProcessorStep": step}):
        yield
