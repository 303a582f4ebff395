"""Flags the bridge adds to LeRobot's own for some policies, and what they hold.

LeRobot's π0 and π0.5 name two things in code rather than in their config:

* the tokenizer their processor loads, always ``google/paligemma-3b-pt-224`` from the hub.
  ``--policy.tokenizer_name`` names it, a hub id or a local folder, so a run works
  offline from local files (SmolVLA's tokenizer is its ``--policy.vlm_model_name``, a
  LeRobot field that already takes a local folder);
* their sizes: PaliGemma's Gemma variants (``gemma_2b``, ``gemma_300m``), SigLIP so400m and
  a 257,152-token vocabulary. ``--policy.sizes`` redefines what the variant names mean,
  the vision tower and the vocabulary, for tests and small experiments on LeRobot's own
  classes; unset (the default), the sizes are LeRobot's.

π0, π0.5 and SmolVLA also get ``--policy.attention``: how their joint layers attend,
``sdpa`` (a fused kernel, ``fused_attention``) or ``eager`` (LeRobot's own code). It
changes no weight, name or file, so a resume may change it (``resume_may_change``).

None of these is a field of LeRobot's config, so none is written to ``config.json``; all
are in the run's ``train_config.json``, and ``--policy.path`` takes them from there.
Torch-free (the hook module imports it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
# LeRobot's joint attention reshapes its output to 8 heads (compute_layer_complete).
PI_HEADS = 8


class GemmaSize(BaseModel):
    """One Gemma tower, as LeRobot's ``GemmaConfig`` describes it."""

    model_config = ConfigDict(extra="forbid")
    width: PositiveInt
    depth: PositiveInt
    mlp_dim: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt


class VisionSize(BaseModel):
    """The SigLIP vision tower (its projection to the language width follows the width)."""

    model_config = ConfigDict(extra="forbid")
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    patch_size: PositiveInt


class PiSizes(BaseModel):
    """``--policy.sizes``: what LeRobot's π0/π0.5 build instead of their fixed sizes."""

    model_config = ConfigDict(extra="forbid")
    gemma_2b: GemmaSize | None = None
    gemma_300m: GemmaSize | None = None
    vision: VisionSize | None = None
    vocab_size: PositiveInt | None = None

    @model_validator(mode="after")
    def _joint_attention_fits(self) -> PiSizes:
        towers = {name: size for name, size in (("gemma_2b", self.gemma_2b), ("gemma_300m", self.gemma_300m)) if size}
        for name, size in towers.items():
            if size.num_heads != PI_HEADS:
                raise ValueError(
                    f"{name}.num_heads={size.num_heads}: LeRobot's joint attention assumes {PI_HEADS} heads per tower"
                )
        if len({size.head_dim for size in towers.values()}) > 1:
            raise ValueError("gemma_2b and gemma_300m need one head_dim: their attention is computed jointly")
        return self


PI_FIELDS: dict[str, tuple[Any, Any]] = {
    "tokenizer_name": (str, Field(
        PALIGEMMA_TOKENIZER,
        description="The PaliGemma tokenizer LeRobot's processor tokenizes the task with: a hub id or a local "
        "folder (bridge flag; LeRobot always loads google/paligemma-3b-pt-224).",
    )),
    "sizes": (PiSizes | None, Field(
        None,
        description="Sizes for LeRobot's pi0/pi0.5 classes instead of their fixed ones, as JSON: "
        '{"gemma_2b": {"width", "depth", "mlp_dim", "num_heads" (8), "num_kv_heads", "head_dim"}, "gemma_300m": '
        '{...}, "vision": {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", '
        '"patch_size"}, "vocab_size"} (bridge flag, for tests and small experiments; unset: LeRobot\'s sizes).',
    )),
}

ATTENTION_FIELDS: dict[str, tuple[Any, Any]] = {
    "attention": (Literal["sdpa", "eager"], Field(
        "sdpa",
        description="How the joint layers of the VLM and the action expert attend: sdpa, through "
        "torch's fused scaled_dot_product_attention (no score matrix kept; LeRobot's mask, scale and "
        "grouped heads), or eager, LeRobot's own attention code. The same weights and checkpoints either "
        "way; may change on resume (bridge flag).",
    )),
}

# LeRobot type -> the bridge's extra fields: name -> (annotation, pydantic Field).
EXTRA_FIELDS: dict[str, dict[str, tuple[Any, Any]]] = {
    "pi0": PI_FIELDS | ATTENTION_FIELDS,
    "pi05": PI_FIELDS | ATTENTION_FIELDS,
    "smolvla": ATTENTION_FIELDS,
}
