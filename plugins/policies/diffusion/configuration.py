"""Diffusion Policy's config fields (torch-free so `lerobot train --help` lists them without torch).

Architecture follows the transformer variant of Chi et al. 2023 ("Diffusion Policy:
Visuomotor Policy Learning via Action Diffusion"); the defaults are sized for the
embedded reach task on a CPU — raise them for real robots.

Frame offsets (``delta_indices``):

* ``action``: ``[0 .. horizon-1]`` — the denoised chunk starts at the current frame, so
  the first ``n_action_steps`` of it are executed as they are. (LeRobot's variant also
  denoises the ``n_obs_steps - 1`` past actions; those are already known at inference,
  so they cost tokens without changing what is executed.)
* ``observation.state`` and every camera: ``[-(n_obs_steps-1) .. 0]`` when
  ``n_obs_steps > 1`` (frames before an episode's start repeat its first frame, as the
  inference queue does after ``reset``), as LeRobot's diffusion conditions on both.
  ``delta_indices()`` is asked before the dataset exists, so the cameras are named by
  the wildcard ``observation.images.*``, which the dataset expands to its cameras. With
  ``n_obs_steps = 1`` nothing is requested, so a dataset without a state vector works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from lerobot_kit.api import PolicyConfig

if TYPE_CHECKING:
    from lerobot_kit.api import DatasetMeta

STATE_KEY = "observation.state"  # core.data.dataset.STATE_KEY, repeated: that module pulls numpy into --help
ACTION_KEY = "action"
ALL_CAMERAS = "observation.images.*"  # core.data.windows.ALL_CAMERAS, repeated for the same reason


class DiffusionConfig(PolicyConfig):
    type: str = Field("diffusion", description="Policy type, from the plugin registry (`lerobot plugins`).")
    n_obs_steps: int = Field(
        2, ge=1, description="Frames of state and camera history the denoiser is conditioned on (current included)."
    )
    horizon: int = Field(16, ge=1, description="Actions denoised per chunk, starting at the current frame.")
    n_action_steps: int = Field(8, ge=1, description="Actions executed from each chunk before sampling again.")
    dim_model: int = Field(128, ge=8, description="Transformer width.")
    n_heads: int = Field(4, ge=1, description="Attention heads.")
    dim_feedforward: int = Field(512, ge=8, description="Feed-forward width inside each block.")
    n_layers: int = Field(4, ge=1, description="DiffusionTransformerBlock blocks in the denoiser.")
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout on embeddings, attention and feed-forward outputs.")
    image_keypoints: int = Field(
        32, ge=1, description="Spatial-softmax keypoints of the image encoder (2 coordinates each)."
    )
    num_train_timesteps: int = Field(100, ge=2, description="DDPM noise levels (squaredcos_cap_v2 betas).")
    num_inference_steps: int = Field(
        10, ge=1, description="Denoising steps when sampling a chunk (evenly strided over the training levels)."
    )
    prediction_type: Literal["epsilon", "sample"] = Field(
        "epsilon", description="What the denoiser predicts: the added noise (the paper's choice) or the clean chunk."
    )
    sampler: Literal["ddim", "ddpm"] = Field(
        "ddim", description="Sampling update: deterministic DDIM (eta=0), or stochastic DDPM on the strided levels."
    )
    clip_sample: bool = Field(True, description="Clip each step's predicted clean chunk to ±clip_sample_range.")
    clip_sample_range: float = Field(
        1.0, gt=0, description="Clip bound; 1.0 matches min_max normalisation of actions to [-1, 1]."
    )
    mask_padded_actions: bool = Field(
        True,
        description="Leave chunk frames past an episode's end (action_is_pad) out of the loss; "
        "LeRobot trains on them (they repeat the last action).",
    )
    normalization: Literal["mean_std", "min_max"] = Field(
        "min_max", description="State/action normalisation; min_max keeps actions inside the clip range."
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> DiffusionConfig:
        # Caught here, at flag-parsing time, instead of after process groups are up.
        if self.n_action_steps > self.horizon:
            raise ValueError(f"n_action_steps={self.n_action_steps} exceeds horizon={self.horizon}")
        if self.dim_model % self.n_heads:
            raise ValueError(f"dim_model={self.dim_model} is not divisible by n_heads={self.n_heads}")
        if self.num_inference_steps > self.num_train_timesteps:
            raise ValueError(
                f"num_inference_steps={self.num_inference_steps} exceeds num_train_timesteps={self.num_train_timesteps}"
            )
        return self

    def delta_indices(self) -> dict[str, list[int]]:
        offsets = {ACTION_KEY: list(range(self.horizon))}
        if self.n_obs_steps > 1:
            offsets[STATE_KEY] = list(range(1 - self.n_obs_steps, 1))
            offsets[ALL_CAMERAS] = list(range(1 - self.n_obs_steps, 1))
        return offsets

    def weight_shapes(self, meta: DatasetMeta) -> dict[str, tuple[int, ...]]:
        """The model's ``state_dict`` shapes (``lerobot_kit.api.WeightShapes``), without torch."""
        from lerobot_kit.plugins.policies.diffusion.shapes import diffusion_shapes

        return diffusion_shapes(self, meta)
