"""ACT's config fields (torch-free so `lerobot train --help` lists them without torch).

Architecture follows LeRobot's ACT (Zhao et al. 2023); the defaults are sized for the
embedded task on a CPU and documented in docs/configuration.md — raise them for real robots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from lerobot_kit.api import PolicyConfig

if TYPE_CHECKING:
    from lerobot_kit.api import DatasetMeta


class ACTConfig(PolicyConfig):
    type: str = "act"
    chunk_size: int = Field(10, ge=1, description="Actions predicted per forward pass.")
    n_action_steps: int = Field(10, ge=1, description="Actions executed from each chunk before predicting again.")
    dim_model: int = Field(64, ge=8, description="Transformer width.")
    n_heads: int = Field(4, ge=1, description="Attention heads.")
    dim_feedforward: int = Field(256, ge=8, description="Feed-forward width.")
    feedforward_activation: Literal["relu", "gelu"] = Field("relu", description="Feed-forward activation.")
    n_encoder_layers: int = Field(2, ge=1, description="ACTEncoderLayer blocks in the encoder.")
    n_decoder_layers: int = Field(1, ge=1, description="ACTDecoderLayer blocks in the decoder.")
    pre_norm: bool = Field(False, description="Pre-LayerNorm blocks instead of post-norm.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout in the transformer.")
    use_vae: bool = Field(True, description="Train the CVAE latent (style variable) with its KL term.")
    latent_dim: int = Field(32, ge=1, description="CVAE latent size.")
    n_vae_encoder_layers: int = Field(2, ge=1, description="ACTEncoderLayer blocks in the CVAE encoder.")
    kl_weight: float = Field(10.0, ge=0, description="Weight of the KL term in the loss.")
    vision_backbone: Literal["conv", "resnet18"] = Field(
        "conv", description="Image encoder: the small built-in conv net, or torchvision's resnet18 if installed."
    )
    normalization: Literal["mean_std", "min_max"] = Field("mean_std", description="State/action normalisation.")

    @model_validator(mode="after")
    def _check_shapes(self) -> ACTConfig:
        # Caught here, at flag-parsing time, instead of after process groups are up.
        if self.n_action_steps > self.chunk_size:
            raise ValueError(f"n_action_steps={self.n_action_steps} exceeds chunk_size={self.chunk_size}")
        if self.dim_model % self.n_heads:
            raise ValueError(f"dim_model={self.dim_model} is not divisible by n_heads={self.n_heads}")
        return self

    def delta_indices(self) -> dict[str, list[int]]:
        return {"action": list(range(self.chunk_size))}

    def weight_shapes(self, meta: DatasetMeta) -> dict[str, tuple[int, ...]]:
        """The model's ``state_dict`` shapes (``lerobot_kit.api.WeightShapes``), without torch."""
        from lerobot_kit.plugins.policies.act.shapes import act_shapes

        return act_shapes(self, meta)
