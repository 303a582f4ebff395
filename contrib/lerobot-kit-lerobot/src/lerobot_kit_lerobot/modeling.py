"""LeRobot's policy classes as lerobot-kit policies.

``LerobotPolicy`` builds LeRobot's own policy object (``ACTPolicy``, ``DiffusionPolicy``,
...) and adopts its child modules as its own, under the same names. So the module tree,
and with it every state-dict key, is LeRobot's: ``model.safetensors`` written by any
lerobot-kit checkpoint format is LeRobot's file, a ``model.safetensors`` LeRobot wrote
loads with ``--policy.path``, a PEFT adapter carries the keys ``PeftModel`` expects on
LeRobot's policy, and FSDP2 shards LeRobot's layers in place. The LeRobot object itself
is kept unregistered (registering it would list every tensor twice) and does the
computing: ``forward``, ``select_action`` and ``reset`` are LeRobot's, on the same
modules.

Normalisation is LeRobot's too: ``make_processors`` builds LeRobot's pre/post processor
pipelines from the dataset's stats, and checkpoints hold LeRobot's ``config.json`` and
processor files next to lerobot-kit's own (``dataset_meta.json``, ``train_config.json``,
``training_state/``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from lerobot.policies.pretrained import PreTrainedPolicy
from torch import Tensor

from lerobot_kit.api import (
    PER_SAMPLE_LOSS,
    ConfigError,
    DatasetMeta,
    LerobotError,
    PluginError,
    Policy,
    PolicyProcessor,
    UnitGroup,
)
from lerobot_kit_lerobot import camera_masks, joint
from lerobot_kit_lerobot.backbone_weights import backbone_weights_fetched
from lerobot_kit_lerobot.configuration import LerobotPolicyConfig
from lerobot_kit_lerobot.flow_noise import PerSampleDraws
from lerobot_kit_lerobot.language_tokens import check_token_ids, vocabulary_size
from lerobot_kit_lerobot.pi_overrides import check_joint_depths, modeling_module, pi_sizes, pi_tokenizer
from lerobot_kit_lerobot.lerobot_config import to_lerobot_config
from lerobot_kit_lerobot.processors import LerobotProcessor
from lerobot_kit_lerobot.remote_code import no_remote_code
from lerobot_kit_lerobot.sample_losses import act_forward, diffusion_forward
from lerobot_kit_lerobot.schema_gen import check_schema
from lerobot_kit_lerobot.smolvlm_shipped import shipped_vlm
from lerobot_kit_lerobot.vla_loss import flow_matching_loss


class LerobotPolicy(Policy):
    """A LeRobot policy driven by lerobot-kit; subclasses name the LeRobot type."""

    config_class = LerobotPolicyConfig
    lerobot_type: ClassVar[str]
    # Whether LeRobot's constructor can run on the meta device (shapes only); else a meta
    # build is a CPU build moved there (see build_lerobot_policy).
    builds_on_meta: ClassVar[bool] = False
    # Whether LeRobot's preprocessor tokenizes each frame's task text (language-conditioned).
    reads_task: ClassVar[bool] = False
    config: LerobotPolicyConfig

    def __init__(self, config: LerobotPolicyConfig, meta: DatasetMeta) -> None:
        # No _init_from_entry_rng: LeRobot's constructor initialises every weight from the
        # RNG it is entered with, and init_weights replays exactly that construction.
        super().__init__(config, meta)
        self.check_dataset(config, meta)
        check_schema(self.lerobot_type)
        self.lerobot_config = to_lerobot_config(config, meta)
        lerobot_policy = self.build_lerobot()
        own = [name for name, _ in lerobot_policy.named_parameters(recurse=False)]
        own += [name for name, _ in lerobot_policy.named_buffers(recurse=False)]
        if own:
            raise PluginError(
                f"LeRobot's {type(lerobot_policy).__name__} holds tensors outside its submodules ({own}); "
                "the bridge shares only submodules with it"
            )
        for name, child in lerobot_policy.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "lerobot", lerobot_policy)  # unregistered: see the module doc

    @classmethod
    def check_dataset(cls, config: LerobotPolicyConfig, meta: DatasetMeta) -> None:
        """Refuse, before LeRobot's constructor runs, a dataset LeRobot's policy would fail on
        in its first step with an error that does not name the dataset. Every type bridged here
        reads the robot's state (LeRobot 0.6.1's ACT too, though its docs call the state
        optional: it reads the state's device), else a KeyError or "State is required"."""
        if "observation.state" not in meta.features:
            raise ConfigError(
                f"policy.type={config.type} cannot use this dataset (features {sorted(meta.features)}): LeRobot's "
                f"{cls.lerobot_type} reads the robot's state ('observation.state') in every step, and the dataset "
                "has none; train it on a dataset that records the state"
            )

    def build_lerobot(self) -> PreTrainedPolicy:
        """LeRobot's policy for this config, on the current default device."""
        with self.building(self.config):
            return build_lerobot_policy(self.lerobot_config, on_meta=self.builds_on_meta)

    @classmethod
    @contextlib.contextmanager
    def building(cls, config: LerobotPolicyConfig) -> Iterator[None]:
        """What LeRobot's constructor runs inside: a backbone's weights it cannot fetch are one
        line naming the flag (``backbone_weights``), and the type's own ``construction``."""
        with backbone_weights_fetched(config), cls.construction(config):
            yield

    @classmethod
    def construction(cls, config: LerobotPolicyConfig) -> contextlib.AbstractContextManager[None]:
        """What LeRobot's constructor runs inside (the bridge's size flags, for some types)."""
        return contextlib.nullcontext()

    @classmethod
    def make_processors(cls, config: LerobotPolicyConfig, meta: DatasetMeta) -> tuple[PolicyProcessor, PolicyProcessor]:
        """LeRobot's own pipelines for this policy, normalising with the dataset's stats."""
        stats = {key: {name: torch.as_tensor(value) for name, value in stats.items()} for key, stats in meta.stats.items()}
        with cls.processor_construction(config):
            pre, post = make_pre_post_processors(to_lerobot_config(config, meta), dataset_stats=stats)
        task_needed_by = f"policy.type={config.type}" if cls.reads_task else None
        return LerobotProcessor(pre, task_needed_by), LerobotProcessor(post)

    @classmethod
    def processor_construction(cls, config: LerobotPolicyConfig) -> contextlib.AbstractContextManager[None]:
        """What LeRobot's processor factory runs inside (the bridge's tokenizer flag, for some types)."""
        return contextlib.nullcontext()

    def save_config(self, directory: Path) -> None:
        """LeRobot's ``config.json``, as LeRobot writes it (its ``from_pretrained`` reads it)."""
        self.lerobot_config._save_pretrained(Path(directory))

    def init_weights(self) -> None:
        """Build LeRobot's policy afresh from the current RNG and take its weights: what
        construction does, so a meta-device build equals a CPU build from the same seed."""
        with torch.device("cpu"):
            fresh = self.build_lerobot()
        self.load_state_dict(fresh.state_dict(), strict=True)

    def train(self, mode: bool = True) -> LerobotPolicy:
        super().train(mode)
        self.lerobot.training = mode  # LeRobot code may read its own flag
        return self

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """LeRobot's loss and its scalar metrics; its ``loss`` entry is left out, because the
        run logs the loss it trains on (weighted across ranks where ``loss_weight`` says so).
        Each sample's loss too, where the type has one (``lerobot_forward``)."""
        loss, logs, per_sample = self.lerobot_forward(batch)
        metrics = {name: value for name, value in (logs or {}).items() if name != "loss" and _scalar(value)}
        metrics = {name: torch.as_tensor(value).detach() for name, value in metrics.items()}
        if per_sample is not None:
            metrics[PER_SAMPLE_LOSS] = per_sample.detach()
        return loss, metrics

    def lerobot_forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any] | None, Tensor | None]:
        """LeRobot's ``forward`` (loss and logs) and each sample's loss (None: not known)."""
        loss, logs = self.lerobot.forward(batch)
        return loss, logs, None

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        return self.lerobot.predict_action_chunk(batch)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        return self.lerobot.select_action(batch)

    def reset(self) -> None:
        self.lerobot.reset()


def build_lerobot_policy(lerobot_config: PreTrainedConfig, *, on_meta: bool = False) -> PreTrainedPolicy:
    """LeRobot's policy class for the config, constructed as LeRobot's ``make_policy`` does
    for a fresh policy (but left on the current default device: the CPU, or meta).

    A sharded run builds the model on the meta device on all ranks but the main one.
    ACT and Diffusion cannot be built there: their constructors run the backbone on a
    dummy image to size the next layer, and keep tensors outside their modules
    (Diffusion's noise-scheduler tables) that nothing would fill later. So their meta
    build is a CPU build whose parameters and buffers then move to the meta device (the
    main process broadcasts their values), as every rank of LeRobot's own distributed
    training builds the whole model. The VLA policies (``on_meta``) build on meta itself
    — π0.5 has 4 B parameters — with LeRobot's ``config.device`` set to where they are
    built for the construction (their constructors move the model there).
    """
    policy_class = get_policy_class(lerobot_config.type)
    device = torch.get_default_device()
    if on_meta:
        recorded = lerobot_config.device
        lerobot_config.device = str(device)
        try:
            return policy_class(config=lerobot_config)
        finally:
            lerobot_config.device = recorded
    if device.type != "meta":
        return policy_class(config=lerobot_config)
    with torch.device("cpu"):
        policy = policy_class(config=lerobot_config)
    return policy.to("meta")


def _scalar(value: Any) -> bool:
    """LeRobot's loss dicts mix float metrics with per-sample tensors; only scalars are logged."""
    return isinstance(value, (int, float)) or (isinstance(value, Tensor) and value.numel() == 1)


def valid_actions(batch: dict[str, Tensor]) -> Tensor:
    """The action entries that are not padding past an episode's end: the divisor of
    LeRobot's masked losses (times the action size, which is the same on every rank)."""
    return (~batch["action_is_pad"]).sum()


class LerobotACT(LerobotPolicy):
    lerobot_type = "act"
    # LeRobot 0.6.1 declares no wrap units: the transformer layers hold most parameters.
    _fsdp_wrap_modules = ["ACTEncoderLayer", "ACTDecoderLayer"]
    # The feed-forward layers of every transformer layer (attention runs through
    # nn.MultiheadAttention's fused projections, which LoRA does not reach).
    default_peft_targets = ["linear1", "linear2"]

    def lerobot_forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any] | None, Tensor | None]:
        return act_forward(self.lerobot, batch)

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor | None:
        """LeRobot's ACT divides its L1 loss by the valid action entries of the batch it
        sees, so data-parallel ranks are weighted by theirs: the run's loss is the masked
        mean over the whole global batch, whatever the number of ranks. With the VAE on,
        its KL term (a per-sample mean) is weighted the same way: exact on one process,
        a valid-entry-weighted mean over ranks on several."""
        return valid_actions(batch) if "action_is_pad" in batch else None


class LerobotDiffusion(LerobotPolicy):
    lerobot_type = "diffusion"
    _fsdp_wrap_modules = ["DiffusionConditionalResidualBlock1d"]
    default_peft_targets = ["cond_encoder.1"]

    def lerobot_forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any] | None, Tensor | None]:
        return diffusion_forward(self.lerobot, batch)

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor | None:
        """Diffusion's loss is a masked mean only with ``do_mask_loss_for_padding``; then
        ranks are weighted by their valid action entries, as for ACT."""
        masked = self.lerobot_config.do_mask_loss_for_padding and "action_is_pad" in batch
        return valid_actions(batch) if masked else None


class LerobotVLA(LerobotPolicy):
    """A vision-language-action policy of LeRobot (π0, π0.5, SmolVLA): a VLM and an action
    expert whose layers attend jointly, trained by flow matching.

    Sharding: the joint layers are unit groups run by their method (``joint_layer``), the
    vision tower's layers units by class, the token embedding and the (never called)
    language-model heads units by path; what remains in the root is small (projections,
    norms, the vision embeddings). Flow-matching noise and time are drawn per sample
    (``flow_noise``), so training does not depend on how the batch is split.

    Mixtures: a camera some members lack is masked per sample (``camera_masks``), and
    vectors the mixture zero-padded to its widest member are padded further by LeRobot's
    own ``pad_vector``, to ``max_state_dim`` / ``max_action_dim``.
    """

    builds_on_meta = True
    reads_task = True
    accepts_missing_cameras = True
    pads_vectors = True
    # Whether LeRobot's model projects the state vector, zero-padded to max_state_dim (π0,
    # SmolVLA); π0.5 writes the state into the prompt instead.
    projects_state: ClassVar[bool] = True

    def __init__(self, config: LerobotPolicyConfig, meta: DatasetMeta) -> None:
        super().__init__(config, meta)
        self.install_joint()
        camera_masks.install(self.lerobot)
        self.draws = PerSampleDraws(self.lerobot.model, seed=torch.initial_seed())
        self.tokens_checked = False

    @classmethod
    def check_dataset(cls, config: LerobotPolicyConfig, meta: DatasetMeta) -> None:
        """Also a camera (else LeRobot's "All image features are missing"), and vectors no
        wider than LeRobot pads them to."""
        if not meta.image_keys():
            raise ConfigError(
                f"policy.type={config.type} cannot use this dataset (features {sorted(meta.features)}): LeRobot's "
                f"{cls.lerobot_type} reads at least one camera image in every step, and the dataset has no image "
                "or video feature; train it on a dataset recorded with a camera"
            )
        super().check_dataset(config, meta)
        check_padded_widths(config, meta, cls.projects_state)

    def install_joint(self) -> None:
        raise NotImplementedError

    def token_embedding(self) -> torch.nn.Embedding:
        """The embedding LeRobot's model looks the prompt's token ids up in."""
        raise NotImplementedError

    # The flag naming the hub files LeRobot loads for this policy (a local folder works offline).
    files_flag: ClassVar[str]

    @classmethod
    def files_needed(cls, config: LerobotPolicyConfig) -> str:
        """What LeRobot loads from the ``files_flag`` folder with this config, for the error naming it."""
        raise NotImplementedError

    @classmethod
    @contextlib.contextmanager
    def building(cls, config: LerobotPolicyConfig) -> Iterator[None]:
        with files_from(config, cls.files_flag, cls.files_needed(config)), cls.construction(config):
            yield

    @classmethod
    def make_processors(cls, config: LerobotPolicyConfig, meta: DatasetMeta) -> tuple[PolicyProcessor, PolicyProcessor]:
        with files_from(config, cls.files_flag, cls.files_needed(config)):
            return super().make_processors(config, meta)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """LeRobot's loss and each sample's, without the metrics its forward reads back to the
        host (``vla_loss``). The first batch's token ids are checked against the vocabulary
        (see ``language_tokens``)."""
        if not self.tokens_checked:
            flag = f"--policy.{self.files_flag}={getattr(self.config, self.files_flag)}"
            check_token_ids(batch, vocabulary_size(self.token_embedding()), flag)
            self.tokens_checked = True
        with self.draws.for_batch(batch) if self.training else contextlib.nullcontext():
            loss, per_sample = flow_matching_loss(self.lerobot, batch)
        return loss, {PER_SAMPLE_LOSS: per_sample.detach()}


def check_padded_widths(config: LerobotPolicyConfig, meta: DatasetMeta, projects_state: bool) -> None:
    """LeRobot's VLAs zero-pad the action (and a projected state) to ``max_action_dim`` /
    ``max_state_dim`` and leave a wider one as it is, which their projections then fail on
    in the first step with a shape error: refuse such a dataset before anything is built."""
    widths = {"action": "max_action_dim"} | ({"observation.state": "max_state_dim"} if projects_state else {})
    for key, field in widths.items():
        feature, limit = meta.features.get(key), getattr(config, field)
        if feature is not None and feature.shape and feature.shape[-1] > limit:
            raise ConfigError(
                f"--policy.{field}={limit} is narrower than the dataset's {key!r} ({feature.shape[-1]} values): "
                f"LeRobot's {config.type.removeprefix('lerobot_')} zero-pads it to {field} and cannot shorten it; "
                f"set --policy.{field}={feature.shape[-1]} or more"
            )


@contextlib.contextmanager
def files_from(config: LerobotPolicyConfig, flag: str, needed: str) -> Iterator[None]:
    """A hub id or folder LeRobot cannot load its files from is one error line naming the flag:
    files missing (``OSError``), or damaged, which fails anywhere inside transformers' loading
    (a ``JSONDecodeError``, a ``KeyError`` on a missing entry): what fails inside a
    ``from_pretrained`` of transformers is the folder's (but memory running out is not),
    anything else stays the bridge's. No folder's own code runs (``remote_code``)."""
    try:
        with no_remote_code(f"--policy.{flag}={getattr(config, flag)}"):
            yield
    except LerobotError:
        raise  # a line of the bridge's already, naming the flag
    except Exception as exc:
        out_of_memory = isinstance(exc, (MemoryError, torch.OutOfMemoryError))
        if out_of_memory or not (isinstance(exc, OSError) or raised_in_transformers_loading(exc)):
            raise
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = first_line if isinstance(exc, OSError) and first_line else f"{type(exc).__name__}: {first_line}"
        raise ConfigError(
            f"--policy.{flag}={getattr(config, flag)}: LeRobot cannot load {needed} from it ({reason}); give a "
            "local folder holding them, undamaged (the hub is used only when it is reachable and the name is a "
            "hub id)"
        ) from exc


def raised_in_transformers_loading(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside a ``from_pretrained`` of transformers."""
    trace = exc.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "from_pretrained" and module.startswith("transformers."):
            return True
        trace = trace.tb_next
    return False


class LerobotPi(LerobotVLA):
    """π0 and π0.5: PaliGemma (SigLIP + Gemma) and a Gemma action expert."""

    files_flag = "tokenizer_name"

    _fsdp_wrap_modules = ["SiglipEncoderLayer"]
    # LeRobot's own default (PI0Policy/PI05Policy._get_default_peft_targets): the expert's
    # query and value projections and the action/state projections.
    default_peft_targets = (
        r"(.*\.gemma_expert\..*\.self_attn\.(q|v)_proj|model\.(state_proj|action_in_proj|action_out_proj|"
        r"action_time_mlp_in|action_time_mlp_out))"
    )

    @classmethod
    def files_needed(cls, config: LerobotPolicyConfig) -> str:
        return "PaliGemma's tokenizer (tokenizer.json, tokenizer_config.json)"

    @classmethod
    def construction(cls, config: LerobotPolicyConfig) -> contextlib.AbstractContextManager[None]:
        check_joint_depths(cls.lerobot_type, config)
        return pi_sizes(cls.lerobot_type, config.sizes)  # type: ignore[attr-defined]

    @classmethod
    def processor_construction(cls, config: LerobotPolicyConfig) -> contextlib.AbstractContextManager[None]:
        return pi_tokenizer(cls.lerobot_type, config.tokenizer_name)  # type: ignore[attr-defined]

    @classmethod
    def make_processors(cls, config: LerobotPolicyConfig, meta: DatasetMeta) -> tuple[PolicyProcessor, PolicyProcessor]:
        check_quantile_stats(config, meta)
        return super().make_processors(config, meta)

    def token_embedding(self) -> torch.nn.Embedding:
        return self.model.paligemma_with_expert.paligemma.model.language_model.get_input_embeddings()

    def install_joint(self) -> None:
        with_expert = self.model.paligemma_with_expert
        attention = self.config.attention  # type: ignore[attr-defined]
        joint.install_pi(with_expert, modeling_module(self.lerobot_type), attention=attention)
        freeze_unreached(with_expert)

    def fsdp_unit_groups(self) -> list[UnitGroup]:
        depth = len(self.model.paligemma_with_expert.paligemma.model.language_model.layers)
        return joint.pi_unit_groups("model.paligemma_with_expert", depth)


def freeze_unreached(with_expert: torch.nn.Module) -> None:
    """Freeze the parameters of a ``PaliGemmaWithExpertModel`` that π0/π0.5's loss never
    reaches: both language-model heads (never called), and what only produces the VLM's own
    output after the last joint attention (the last VLM layer's output projection, norm and
    MLP, and the final norm), which the loss, computed on the expert's output, never reads.
    They would get no gradient either way (so training is unchanged); trainable, they would
    get no optimizer state, which a resume then looks for. LeRobot's SmolVLA freezes its
    heads and last VLM layer for the same reason."""
    language = with_expert.paligemma.model.language_model
    last = language.layers[-1]
    unreached = (with_expert.paligemma.lm_head, with_expert.gemma_expert.lm_head, last.self_attn.o_proj,
                 last.post_attention_layernorm, last.mlp, language.norm)
    for module in unreached:
        module.requires_grad_(False)


class LerobotPI0(LerobotPi):
    lerobot_type = "pi0"


class LerobotPI05(LerobotPi):
    lerobot_type = "pi05"
    projects_state = False


class LerobotSmolVLA(LerobotVLA):
    """SmolVLA: SmolVLM (its vision encoder and first layers) and a smaller expert."""

    lerobot_type = "smolvla"
    files_flag = "vlm_model_name"
    _fsdp_wrap_modules = ["SmolVLMEncoderLayer"]
    # LeRobot's own default (SmolVLAPolicy._get_default_peft_targets).
    default_peft_targets = (
        r"(model\.vlm_with_expert\.lm_expert\..*\.(q|v)_proj|model\.(state_proj|action_in_proj|action_out_proj|"
        r"action_time_mlp_in|action_time_mlp_out))"
    )

    @classmethod
    def files_needed(cls, config: LerobotPolicyConfig) -> str:
        if config.load_vlm_weights:  # type: ignore[attr-defined]
            return ("its VLM's config, processor and weights (config.json, processor and tokenizer files, "
                    "model.safetensors: --policy.load_vlm_weights=true)")
        return "its VLM's config and processor (config.json, processor and tokenizer files)"

    @classmethod
    def construction(cls, config: LerobotPolicyConfig) -> contextlib.AbstractContextManager[None]:
        """LeRobot's default VLM from the architecture the bridge ships (``smolvlm_shipped``):
        no download to build the model; another VLM must be a SmolVLM."""
        return shipped_vlm(config.vlm_model_name, config.load_vlm_weights)  # type: ignore[attr-defined]

    def token_embedding(self) -> torch.nn.Embedding:
        return self.model.vlm_with_expert.get_vlm_model().text_model.get_input_embeddings()

    def install_joint(self) -> None:
        flow = self.model
        joint.install_smolvla(flow.vlm_with_expert, attention=self.config.attention)  # type: ignore[attr-defined]
        # Plain tensor attributes of LeRobot's model (token ids), made where the model was
        # built: on meta they would hold no values, and they are neither parameters nor buffers.
        if flow.global_image_start_token.is_meta:
            flow.global_image_start_token = torch.tensor(
                [flow.fake_image_token, flow.global_image_token], dtype=torch.long, device="cpu"
            )
            flow.image_end_token = torch.tensor([flow.fake_image_token], dtype=torch.long, device="cpu")

    def fsdp_unit_groups(self) -> list[UnitGroup]:
        return joint.smolvla_unit_groups("model.vlm_with_expert", self.model.vlm_with_expert)

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor | None:
        """SmolVLA averages its loss over the valid (not padded) action entries of the batch
        it sees, so ranks are weighted by theirs, as for ACT."""
        return valid_actions(batch) if "action_is_pad" in batch else None


def check_quantile_stats(config: LerobotPolicyConfig, meta: DatasetMeta) -> None:
    """LeRobot's QUANTILES normalisation (π0.5's default for state and action) reads the
    dataset's q01/q99 stats; refuse, before building anything, a dataset without them."""
    modes = {"QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}
    mapping = config.normalization_mapping  # type: ignore[attr-defined]
    for kind, key in (("STATE", "observation.state"), ("ACTION", "action")):
        needed = modes.get(str(mapping.get(kind)), ())
        if key in meta.features:
            missing = [name for name in needed if name not in meta.stats.get(key, {})]
            if missing:
                raise ConfigError(
                    f"policy.type={config.type} normalises {key!r} by {mapping[kind]}, which needs the dataset's "
                    f"{'/'.join(needed)} stats, but its meta/stats.json has no {'/'.join(missing)} for it: set "
                    "--policy.normalization_mapping='{\"VISUAL\": \"IDENTITY\", \"STATE\": \"MEAN_STD\", "
                    "\"ACTION\": \"MEAN_STD\"}' (or recompute the dataset's stats with LeRobot)"
                )
