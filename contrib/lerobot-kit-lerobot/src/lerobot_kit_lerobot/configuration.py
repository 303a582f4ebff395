"""One pydantic config class per bridged LeRobot policy, built from ``schemas.json``.

Every field of LeRobot's config dataclass becomes a typed flag of the same name and
default (``--policy.dim_model=256``): pydantic checks its type, and an unknown flag gets
lerobot-kit's "did you mean" error. Cross-field rules stay LeRobot's: after the types
are checked, the values are handed to LeRobot's own dataclass, and what its
``__post_init__`` refuses is reported as a flag error too.

``--policy.path`` may name a checkpoint LeRobot wrote (or one of ours, which has
LeRobot's ``config.json``): the fields not given as flags are read from its
``config.json``, so the policy is built with that checkpoint's shapes and its weights
load; the bridge's own fields (``bridge_fields``), from the ``train_config.json`` of a
checkpoint the bridge wrote. The resolved values are what the run records, so a resume
needs nothing else. ``--policy.path`` alone (no ``--policy.type``) on a LeRobot
checkpoint picks the bridge's type: ``claims_pretrained`` recognises LeRobot's files.

Torch-free and LeRobot-free at import (the hook module imports it for every command);
LeRobot is imported when a config is validated.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, SerializerFunctionWrapHandler, create_model, model_serializer, model_validator

from lerobot_kit.api import PolicyConfig
from lerobot_kit_lerobot.bridge_fields import EXTRA_FIELDS
from lerobot_kit_lerobot.files_digest import DIGEST_KEY, FILES_FLAG, folder_digest, resume_views, without_digest
from lerobot_kit_lerobot.folder_files import folder_files_problem
from lerobot_kit_lerobot.policies import registered_name

SCHEMAS: dict[str, Any] = json.loads(files("lerobot_kit_lerobot").joinpath("schemas.json").read_text())


# LeRobot switches that would act inside the units lerobot-kit shards, checkpoints and
# compiles one at a time (π0/π0.5/SmolVLA), and what does their job per unit instead.
REPLACED_BY_LEROBOT_KIT = {
    "gradient_checkpointing": "--accelerator.activation_checkpointing=true (each joint layer and vision layer "
    "recomputed as its own unit)",
    "compile_model": "--accelerator.compile=true (each joint layer pair and vision layer compiled as its own "
    "unit; LeRobot's compile of the whole forward would trace through the sharded units' gathers)",
}


class LerobotPolicyConfig(PolicyConfig):
    """Base of the generated classes: the LeRobot type they stand for and their field names."""

    lerobot_type: ClassVar[str]
    lerobot_fields: ClassVar[tuple[str, ...]]
    bridge_fields: ClassVar[tuple[str, ...]] = ()
    # The flag naming the folder LeRobot loads files from (π0/π0.5's tokenizer, SmolVLA's VLM), and
    # the digest of what it held at validation, recorded with the run (``files_digest``).
    files_flag: ClassVar[str | None] = None
    _files_digest: str | None = PrivateAttr(None)
    # How the VLAs' joint layers attend changes no weight: a resume may switch it.
    resume_may_change: ClassVar[frozenset[str]] = PolicyConfig.resume_may_change | {"attention"}
    # LeRobot's config classes, and the policy built on meta to check the weights, import torch.
    validation_imports_torch: ClassVar[bool] = True

    @classmethod
    def claims_pretrained(cls, saved: dict[str, Any]) -> bool:
        """Whether a ``config.json`` is one LeRobot wrote (or the bridge, in LeRobot's format)
        for this class's LeRobot type: lerobot-kit picks this type for ``--policy.path``
        alone. LeRobot's configs carry the features a policy was built for, which
        lerobot-kit's own do not."""
        return saved.get("type") == cls.lerobot_type and "input_features" in saved and "output_features" in saved

    @model_validator(mode="before")
    @classmethod
    def _fill_from_path(cls, data: Any) -> Any:
        """Fields not given take the values of ``--policy.path``'s ``config.json`` (and the
        bridge's own fields those of its ``train_config.json``, when the bridge wrote it)."""
        if not isinstance(data, dict) or not data.get("path"):
            return data
        missing = [name for name in cls.lerobot_fields if name not in data]
        missing_bridge = [name for name in cls.bridge_fields if name not in data]
        if not missing and not missing_bridge:
            return data
        saved = read_lerobot_config(Path(data["path"]))
        if saved.get("type") != cls.lerobot_type:
            raise ValueError(
                f"--policy.path={data['path']} holds a LeRobot {saved.get('type')!r} policy, not {cls.lerobot_type!r}: "
                f"use --policy.type={registered_name(str(saved.get('type')))}"
            )
        recorded = read_bridge_fields(Path(data["path"])) if missing_bridge else {}
        return {
            **{name: saved[name] for name in missing if name in saved},
            **{name: recorded[name] for name in missing_bridge if name in recorded},
            **data,
        }

    @model_validator(mode="before")
    @classmethod
    def _drop_recorded_digest(cls, data: Any) -> Any:
        """A recorded digest is of its run's folder at that run's start: a config read back from a
        ``train_config.json`` digests the folder it names now (``_digest_files``)."""
        if isinstance(data, dict):
            return without_digest(data)
        return data

    @model_validator(mode="after")
    def _digest_files(self) -> LerobotPolicyConfig:
        """The folder is checked before anything reads it: transformers takes a named pipe or a
        link to nothing for a missing file, and a reader that opens one blocks (``folder_files``)."""
        if not self.files_flag:
            return self
        name = getattr(self, self.files_flag)
        problem = folder_files_problem(name)
        if problem:
            raise ValueError(f"--policy.{self.files_flag}={name}: {problem}")
        self._files_digest = folder_digest(name)
        return self

    @model_serializer(mode="wrap")
    def _with_files_digest(self, handler: SerializerFunctionWrapHandler) -> Any:
        dumped = handler(self)
        if self._files_digest and isinstance(dumped, dict):
            dumped[DIGEST_KEY] = self._files_digest
        return dumped

    @classmethod
    def resume_views(cls, new: dict[str, Any], recorded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A folder of files compares by what it holds, not where it is (``files_digest``)."""
        return resume_views(cls.files_flag, new, recorded)

    @model_validator(mode="after")
    def _lerobot_accepts(self) -> LerobotPolicyConfig:
        from lerobot_kit_lerobot.lerobot_config import to_lerobot_config

        for name, instead in REPLACED_BY_LEROBOT_KIT.items():
            if getattr(self, name, False):
                raise ValueError(f"--policy.{name}=true is LeRobot's own switch; under lerobot-kit use {instead}")
        to_lerobot_config(self)  # raises ValueError with LeRobot's own message
        return self

    def pretrained_problem(self, folder: Path) -> str | None:
        """What lerobot-kit's check of a policy folder this config validated for (inspect-checkpoint,
        ``--policy.path``, a resume, eval) reports beyond its fields: weights that are not the
        model it describes (``pretrained_weights``)."""
        from lerobot_kit_lerobot.pretrained_weights import weights_problem

        return weights_problem(self, folder)

    def plan_inputs(self) -> dict[str, tuple[list[int], str]]:
        """Batch entries a run's preprocessor adds that the dataset has none of, by shape and
        dtype name, for ``lerobot plan`` to trace the step without the preprocessor's files:
        the language-conditioned policies' prompt tokens and mask, ``tokenizer_max_length``
        long (the longest LeRobot's tokenizer step makes them)."""
        if "tokenizer_max_length" not in self.lerobot_fields:
            return {}
        length = int(getattr(self, "tokenizer_max_length"))
        return {"observation.language.tokens": ([length], "int64"),
                "observation.language.attention_mask": ([length], "bool")}

    def lerobot_values(self) -> dict[str, Any]:
        """The LeRobot fields as JSON values (what LeRobot's config.json holds for them)."""
        dumped = self.model_dump(mode="json")
        return {name: dumped[name] for name in self.lerobot_fields}

    def delta_indices(self) -> dict[str, list[int]]:
        from lerobot_kit_lerobot.lerobot_config import delta_indices

        return delta_indices(self)


def read_bridge_fields(path: Path) -> dict[str, Any]:
    """The policy section of the ``train_config.json`` beside a checkpoint's ``config.json``
    (a checkpoint the bridge wrote); ``{}`` for one LeRobot wrote."""
    for candidate in (path / "train_config.json", path / "pretrained_model" / "train_config.json"):
        if candidate.is_file():
            try:
                policy = json.loads(candidate.read_text()).get("policy")
            except (json.JSONDecodeError, AttributeError) as exc:
                raise ValueError(f"--policy.path: {candidate} is not a lerobot-kit train config ({exc})") from exc
            return policy if isinstance(policy, dict) else {}
    return {}


def read_lerobot_config(path: Path) -> dict[str, Any]:
    """The ``config.json`` of a ``pretrained_model/`` folder, or of a step folder's."""
    for candidate in (path / "config.json", path / "pretrained_model" / "config.json"):
        if candidate.is_file():
            try:
                saved = json.loads(candidate.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"--policy.path: {candidate} is not valid JSON ({exc.msg})") from exc
            if not isinstance(saved, dict):
                raise ValueError(f"--policy.path: {candidate} is not a JSON object")
            return saved
    raise ValueError(f"--policy.path={path}: no config.json there (nor in its pretrained_model/)")


def annotation_of(tree: dict[str, Any]) -> Any:
    """The annotation a ``schema_gen.type_tree`` describes."""
    kind = tree["kind"]
    simple = {"int": int, "float": float, "bool": bool, "str": str}
    if kind in simple:
        return simple[kind]
    if kind == "literal":
        return Literal[tuple(tree["values"])]
    if kind == "optional":
        return annotation_of(tree["of"]) | None
    if kind == "list":
        return list[annotation_of(tree["of"])]
    if kind == "tuple" and "items" in tree:
        return tuple[tuple(annotation_of(item) for item in tree["items"])]
    if kind == "tuple":
        return tuple[annotation_of(tree["of"]), ...]
    if kind == "dict":
        return dict[str, annotation_of(tree["of"])]
    raise ValueError(f"schemas.json: unknown type kind {kind!r}")


def make_config_class(lerobot_type: str) -> type[LerobotPolicyConfig]:
    schema = SCHEMAS["policies"][lerobot_type]
    name = registered_name(lerobot_type)
    fields: dict[str, Any] = {"type": (str, Field(name, description="Policy type, from the plugin registry."))}
    for field in schema["fields"]:
        # validate_default: a JSON default (a list for a tuple field) becomes the field's type.
        annotation = annotation_of(field["type"])
        fields[field["name"]] = (annotation, Field(field["default"], description=field["description"], validate_default=True))
    extras = EXTRA_FIELDS.get(lerobot_type, {})
    fields.update(extras)
    config_class = create_model(  # type: ignore[call-overload]
        "Lerobot" + "".join(part.capitalize() for part in lerobot_type.split("_")) + "Config",
        __base__=LerobotPolicyConfig,
        __module__=__name__,
        **fields,
    )
    config_class.lerobot_type = lerobot_type
    config_class.lerobot_fields = tuple(field["name"] for field in schema["fields"])
    config_class.bridge_fields = tuple(extras)
    config_class.files_flag = FILES_FLAG.get(lerobot_type)
    return config_class


CONFIG_CLASSES: dict[str, type[LerobotPolicyConfig]] = {
    lerobot_type: make_config_class(lerobot_type) for lerobot_type in SCHEMAS["policies"]
}
# Module attributes under their class names: pickle finds classes that way, and a run's
# config is pickled to every rank.
globals().update({config_class.__name__: config_class for config_class in CONFIG_CLASSES.values()})
