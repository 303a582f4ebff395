"""The typed training config tree (pydantic v2, no torch).

Every setting of a run lives here; flags (``--a.b=v``) and ``--config_path`` JSON are
merged into one dict and validated by ``parse_train_config``. ``policy`` and
``dataset`` are polymorphic: their class is picked by ``type`` from the plugin
registry, so a plugin's config fields are validated and round-trip like built-ins.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SerializeAsAny, field_validator

from lerobot_kit.core.config.bounds import Seconds, Seed, within_int64
from lerobot_kit.core.config.data_options import ImageTransformsConfig, SamplerConfig
from lerobot_kit.core.registry.contracts import contract


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments validated, every
    number usable (integers within int64, floats finite: ``core.config.bounds``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _numbers_in_range(cls, value: Any) -> Any:
        return within_int64(value)


@contract
class PolicyConfig(Section):
    """Fields every policy has; a policy plugin subclasses this with its own.

    ``resume_may_change`` names the fields that may differ from the checkpoint's on
    resume: where the result is published. Every other field describes the model the
    checkpoint's weights were trained as, so a resume refuses to change it.
    """

    resume_may_change: ClassVar[frozenset[str]] = frozenset({"repo_id", "push_to_hub", "private"})
    # True where validating a checkpoint's config.json imports torch (a plugin that builds its
    # model to check the weights): a torch-free reader such as inspect-checkpoint then runs
    # the check in a child process.
    validation_imports_torch: ClassVar[bool] = False

    type: str = Field("act", description="Policy type, from the plugin registry (`lerobot plugins`).")
    path: str | None = Field(
        None, description="Pretrained policy to start from: a checkpoint step folder, its pretrained_model/, or a "
        "Hugging Face Hub model id (user/name, fetched into the Hub's cache)."
    )
    repo_id: str | None = Field(None, description="Hub repo to publish the final pretrained_model/ to.")
    push_to_hub: bool = Field(True, description="Push to --policy.repo_id at the end (only when repo_id is set).")
    private: bool = Field(False, description="Create the hub repo as private.")

    def delta_indices(self) -> dict[str, list[int]]:
        """Frame offsets the policy needs per feature, e.g. ``{"action": [0..chunk-1]}``."""
        return {}

    @classmethod
    def resume_views(cls, new: dict[str, Any], recorded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """This section of the resumed run and of the checkpoint (``model_dump(mode="json")``) as a
        resume compares them: a type whose field names files by where they are (a tokenizer
        folder) may compare what they hold instead."""
        return new, recorded

    def to_dict(self) -> dict[str, Any]:
        """A plain dict: ``peft`` reads a model's ``config`` through ``to_dict`` (transformers' convention)."""
        return self.model_dump(mode="json")


@contract
class DatasetConfig(Section):
    """Fields every dataset has; a dataset plugin subclasses this with its own.

    Only fields that every type reads belong here: a field a type does not read must be
    missing from its class, so that setting it is refused (``extra="forbid"``) instead of
    silently training on something else. ``resume_may_change`` names the fields that may
    differ from the checkpoint's on resume (where the data lives, how frames are
    augmented); any other change would make the restored data position point into
    different data.
    """

    resume_may_change: ClassVar[frozenset[str]] = frozenset({"image_transforms"})

    type: str = Field(
        "reach", description="Dataset type; `lerobot` when --dataset.repo_id or --dataset.mixture is given."
    )
    image_transforms: ImageTransformsConfig = Field(default_factory=ImageTransformsConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)

    @classmethod
    def resume_views(cls, new: dict[str, Any], recorded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """This section of the resumed run and of the checkpoint (``model_dump(mode="json")``) as a
        resume compares them beyond ``resume_may_change``: a type whose fields nest a setting that
        may change (a mixture member's folder) leaves it out of both."""
        return new, recorded


class ParallelismConfig(Section):
    dp_replicate: int | None = Field(
        None, description="Replica groups (DDP/HSDP). Unset with dp_shard unset: every process is a replica (DDP)."
    )
    dp_shard: int | None = Field(
        None, description="Ranks each model is sharded over (FSDP2); -1 = all launched processes / dp_replicate."
    )
    timeout_s: Seconds = Field(600, description="Collective timeout in seconds; a hung rank fails the run after it.")
    step_timeout_s: Seconds | None = Field(
        None, description="A rank stuck in one training step (data, forward, backward, optimizer) longer "
        "than this prints every thread's stack with its rank and step and exits 124, so the launcher restarts "
        "the group; saves are not counted, the first step after a start (warm-up, compile) gets 10x. Unset: no limit.",
    )


class GradientAccumulationConfig(Section):
    steps: int = Field(1, ge=1, description="Micro-batches per optimizer update; gradients sync once per update.")


DTypeName = Literal["float32", "bfloat16", "float16"]


class MixedPrecisionPolicyConfig(Section):
    param_dtype: DTypeName | None = Field(None, description="FSDP MixedPrecisionPolicy.param_dtype.")
    reduce_dtype: DTypeName | None = Field(None, description="FSDP MixedPrecisionPolicy.reduce_dtype.")
    output_dtype: DTypeName | None = Field(None, description="FSDP MixedPrecisionPolicy.output_dtype.")
    cast_forward_inputs: bool | None = Field(None, description="FSDP MixedPrecisionPolicy.cast_forward_inputs.")

    def is_set(self) -> bool:
        return any(v is not None for v in self.model_dump().values())


class FSDPConfig(Section):
    wrap_modules: list[str] | None = Field(
        None, description='Module class names to shard as units, e.g. \'["Block"]\' (overrides the policy).'
    )
    min_num_params: int | None = Field(
        None, ge=1, description="Wrap every submodule with at least this many parameters (no declared units)."
    )
    reshard_after_forward: bool = Field(True, description="Free each unit's gathered parameters after forward.")
    cpu_offload: bool = Field(False, description="Keep parameters, gradients and optimizer state on CPU.")
    ignored_modules: str | None = Field(
        None, description="Regex (full match) over module paths kept unsharded; for PEFT start with '.*'."
    )
    mixed_precision_policy: MixedPrecisionPolicyConfig = Field(default_factory=MixedPrecisionPolicyConfig)


class AcceleratorConfig(Section):
    mixed_precision: Literal["no", "bf16", "fp16"] = Field("no", description="Autocast precision; fp16 adds a loss scaler.")
    gradient_accumulation: GradientAccumulationConfig = Field(default_factory=GradientAccumulationConfig)
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)
    activation_checkpointing: bool = Field(
        False, description="Recompute each wrap unit's activations in backward instead of keeping them (any layout)."
    )
    compile: bool = Field(False, description="torch.compile each wrap unit (after activation checkpointing, before FSDP).")
    peak_tflops: float | None = Field(
        None, gt=0, description="Dense peak TFLOP/s of one device for the run's dtype, for MFU; default: a table of "
        "known GPUs; on CPU, unset: MFU left out."
    )


class PeftConfig(Section):
    method_type: str | None = Field(None, description="PEFT method, e.g. LORA; unset = full training.")
    r: int = Field(16, ge=1, description="LoRA rank.")
    lora_alpha: int | None = Field(None, description="LoRA alpha (default: r).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] | str | None = Field(
        None, description="Module names (list) or a regex to adapt; default per policy."
    )
    full_training_modules: list[str] | None = Field(None, description="Modules trained in full and saved.")


def _within_float32(value: float) -> float:
    if abs(value) > 3.4e38:
        raise ValueError(f"{value:g} is beyond float32's range (3.4e38), which the optimizer computes in")
    return value


Float32 = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_within_float32)]


class OptimizerConfig(Section):
    """AdamW, the optimizer of every run."""

    # The optimizer keeps its hyperparameters as float32 tensors on some paths; a value past
    # float32's range (or nan/inf) would only fail deep inside the first step.
    lr: Float32 = Field(1e-4, gt=0, description="Learning rate (never scaled automatically).")
    weight_decay: Float32 = Field(1e-4, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1).")
    eps: Float32 = Field(1e-8, gt=0, description="AdamW eps.")
    grad_clip_norm: float | None = Field(10.0, gt=0, allow_inf_nan=False,
                                         description="Clip the global gradient norm (unset: no clipping).")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= beta < 1 for beta in betas):  # also false for nan
            raise ValueError(f"each beta must lie in [0, 1), got {list(betas)}")
        return betas


class SchedulerConfig(Section):
    type: Literal["constant", "cosine"] = Field("constant", description="LR schedule, stepped once per step.")
    num_warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")


class TrackioConfig(Section):
    enable: bool = Field(False, description="Log config and metrics to trackio (local-first).")
    project: str = Field("lerobot-kit", description="trackio project.")


@contract
class EnvConfig(Section):
    """Fields every evaluation environment has; an environment plugin subclasses this with its own."""

    type: str = Field("reach", description="Evaluation environment type, from the plugin registry (`lerobot plugins`).")


MAX_EPISODES = 1_000_000


class EvalConfig(Section):
    """Closed-loop evaluation. Episodes run in batches of ``batch_size`` (one vectorised
    environment each); a batch is the unit dealt to ranks, so results depend on
    ``(checkpoint, seed, n_episodes, batch_size)`` and not on the number of processes."""

    # The episodes' batches and results are held in memory as lists: a million is past any evaluation.
    n_episodes: int = Field(
        50, ge=1, le=MAX_EPISODES,
        description="Episodes per evaluation; episode i starts from seed --seed + i (in training too).",
    )
    batch_size: int = Field(4, ge=1, description="Environments stepped together (and the unit of work of a rank).")
    max_episodes_rendered: int = Field(
        4, ge=0, le=MAX_EPISODES, description="Record the first N episodes as mp4 videos (PyAV)."
    )


class PreemptionConfig(Section):
    """How a run stops on request: at a step boundary that every rank agrees on, with a checkpoint."""

    signals: list[str] = Field(
        ["SIGTERM", "SIGUSR1"], description="Signals that stop the run at the next step boundary with a checkpoint "
        "(exit code 75, so a scheduler requeues it); a second one more than 2 s later exits at once.",
    )
    interrupt: bool = Field(
        True, description="Ctrl-C (SIGINT) stops like the signals above; false: Ctrl-C aborts at once, no checkpoint."
    )

    @field_validator("signals")
    @classmethod
    def _known_signals(cls, names: list[str]) -> list[str]:
        import signal

        for name in names:
            if name not in signal.Signals.__members__:
                raise ValueError(f"{name!r} is not a signal name (e.g. SIGTERM, SIGUSR1)")
            if name in ("SIGKILL", "SIGSTOP"):
                raise ValueError(f"{name} cannot be caught, so it cannot stop a run gracefully")
            if name == "SIGINT":
                raise ValueError("SIGINT (Ctrl-C) is set by --preemption.interrupt")
        return names

    def signal_numbers(self) -> tuple[int, ...]:
        """Every signal that stops the run, Ctrl-C's included when ``interrupt``."""
        import signal

        return tuple(signal.Signals[name] for name in [*self.signals, *(["SIGINT"] if self.interrupt else [])])


class TrainConfig(Section):
    policy: SerializeAsAny[PolicyConfig] = Field(default_factory=PolicyConfig)
    dataset: SerializeAsAny[DatasetConfig] = Field(default_factory=DatasetConfig)
    output_dir: str | None = Field(None, description="Run folder (default outputs/train/<date>/<time>_<job_name>).")
    job_name: str | None = Field(None, description="Run name (default <policy.type>_<dataset.type>).")
    resume: bool | Literal["auto"] = Field(
        False, description="Resume the run in output_dir from checkpoints/last (the newest complete step folder if "
        "last is missing); auto: resume when there is one, else start (for schedulers that rerun one command). A "
        "torchrun or SLURM restart always resumes. Flags on resume take effect, or are refused when the checkpoint "
        "cannot follow them (the policy, the dataset, PEFT, the seed).",
    )
    resume_from: int | None = Field(
        None, ge=0, exclude=True, description="With --resume=true: resume from this step although the run has later "
        "checkpoints; those later step folders are removed before the first step (the run continues from here "
        "instead). Not recorded, so a restart continues from `last`.",
    )
    keep_last_checkpoints: int = Field(
        0, ge=0, description="Keep only the newest K step folders (older ones are deleted once a newer one is "
        "published; never the one `last` points to); 0 keeps all.",
    )
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)
    config_path: str | None = Field(
        None, exclude=True, description="JSON config to start from (flags override it); a checkpoint's "
        "train_config.json with --resume=true resumes that checkpoint.",
    )
    seed: Seed = Field(1000, description="Seed of weights, data order and dropout (0 to 2**32 - 1).")
    steps: int = Field(1000, ge=1, description="Loop steps (micro-batches per worker), not optimizer updates.")
    batch_size: int = Field(8, ge=1, description="Micro-batch per data-parallel worker.")
    num_workers: int | None = Field(
        None, ge=0, le=256, description="DataLoader worker processes per rank (default: the rank's share of CPU "
        "cores - 1, at most 4, for data read from files; 0 for data held in memory, such as the reach task; 0 loads "
        "in the training process; at most 256)."
    )
    log_freq: int = Field(100, ge=1, description="Log every N steps.")
    save_checkpoint: bool = Field(True, description="Write checkpoints.")
    save_freq: int = Field(1000, ge=1, description="Checkpoint every N steps (and at the end).")
    checkpoint_format: str = Field(
        "safetensors", description="Weights format of sharded runs: safetensors | dcp | safetensors_dcp, or a plugin's."
    )
    async_checkpoint: bool = Field(
        False,
        description="Sharded runs: write DCP shards in a background thread; training waits only for a copy in "
        "memory (one more copy of each rank's state), and the checkpoint becomes `last` once fully written.",
    )
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    accelerator: AcceleratorConfig = Field(default_factory=AcceleratorConfig)
    peft: PeftConfig = Field(default_factory=PeftConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    trackio: TrackioConfig = Field(default_factory=TrackioConfig)
    nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="A non-finite loss or gradient norm at a step: stop (exit 1 before updating the weights, "
        "no checkpoint from that state, `last` unchanged) or skip (drop that update; the LR schedule does not "
        "advance; counted as skipped_steps in the log). fp16's loss scaler keeps its own overflow skips.",
    )
    nonfinite_max_consecutive: int = Field(
        10, ge=1, description="With --nonfinite=skip: stop after this many updates in a row were skipped."
    )
    eval_freq: int = Field(
        0, ge=0, description="Evaluate the policy in --env every N steps (and at the end), across all ranks; 0: never."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    env: SerializeAsAny[EnvConfig] = Field(default_factory=EnvConfig)

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_choice(cls, value: Any) -> Any:
        """One error for a bad value instead of one per member of the union."""
        if isinstance(value, str):
            choices = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False, "auto": "auto"}
            if value.strip().lower() not in choices:
                raise ValueError("expected true, false or auto")
            return choices[value.strip().lower()]
        return value

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
