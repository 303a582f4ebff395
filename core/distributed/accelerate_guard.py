"""Refuse to train when Accelerate engine settings are in the environment.

Accelerate is only a launcher here; its engine (``Accelerator``) never runs. A user who
ran ``accelerate config`` (which writes a default_config.yaml that every later
``accelerate launch`` reads) or passed ``--config_file`` would believe their FSDP, mixed
precision or accumulation settings are in effect while lerobot-kit silently ignored
them. So we stop, name each variable, and say which lerobot flag does the same thing.

How the list was found (accelerate 1.15.0, torch 2.13, CPU, no default config): a script
that dumps ``os.environ`` was started with

1. ``accelerate launch --multi_gpu --num_processes=2 dump.py`` (plain). Beyond torch
   elastic's own variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
   GROUP_WORLD_SIZE, ROLE_*, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*, OMP_NUM_THREADS,
   TORCH_NCCL_ASYNC_ERROR_HANDLING) it exports exactly: ACCELERATE_MIXED_PRECISION=no,
   ACCELERATE_DYNAMO_BACKEND=NO, ACCELERATE_DYNAMO_MODE=default,
   ACCELERATE_DYNAMO_USE_FULLGRAPH=False, ACCELERATE_DYNAMO_USE_DYNAMIC=False,
   ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=False. ``--num_processes=1`` and ``--cpu``
   add ACCELERATE_USE_CPU=False/True (and KMP_AFFINITY, KMP_BLOCKTIME for ``--cpu``).
2. ``accelerate launch --config_file fsdp.yaml`` (distributed_type FSDP, fsdp_version 2,
   parallelism_config, mixed_precision bf16, dynamo INDUCTOR, debug) adds:
   ACCELERATE_USE_FSDP, ACCELERATE_USE_PARALLELISM_CONFIG, FSDP_VERSION,
   FSDP_SHARDING_STRATEGY, FSDP_RESHARD_AFTER_FORWARD, FSDP_OFFLOAD_PARAMS,
   FSDP_MIN_NUM_PARAMS, FSDP_AUTO_WRAP_POLICY, FSDP_TRANSFORMER_CLS_TO_WRAP,
   FSDP_STATE_DICT_TYPE, FSDP_FORWARD_PREFETCH, FSDP_USE_ORIG_PARAMS,
   FSDP_CPU_RAM_EFFICIENT_LOADING, FSDP_SYNC_MODULE_STATES, FSDP_ACTIVATION_CHECKPOINTING,
   FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD, FSDP_IGNORED_MODULES,
   PARALLELISM_CONFIG_{DP_REPLICATE_SIZE,DP_SHARD_SIZE,TP_SIZE,CP_SIZE,CP_BACKEND,SP_SIZE,
   SP_BACKEND}, ACCELERATE_DEBUG_MODE, and non-default values of
   ACCELERATE_MIXED_PRECISION and the ACCELERATE_DYNAMO_* variables above.
3. A MULTI_GPU config with ``mixed_precision: fp16`` and ``dynamo_backend: EAGER`` changes
   only ACCELERATE_MIXED_PRECISION and ACCELERATE_DYNAMO_BACKEND.
4. DeepSpeed and Megatron launches need packages not installed here; their variables come
   from reading ``accelerate/utils/launch.py`` (``prepare_deepspeed_cmd_env``,
   ``prepare_multi_gpu_env``): ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_*,
   ACCELERATE_CONFIG_DS_FIELDS, ACCELERATE_GRADIENT_ACCUMULATION_STEPS,
   ACCELERATE_GRADIENT_CLIPPING, ACCELERATE_USE_MEGATRON_LM, MEGATRON_LM_*; fp8 adds
   ACCELERATE_FP8_*; TPU bf16 adds ACCELERATE_DOWNCAST_BF16.

Refused: every variable of (2) and (4) when present, and those of (1) when their value
differs from the plain launch's. Deliberately allowed: the torch elastic variables,
ACCELERATE_USE_CPU (honoured by the accelerate launcher plugin), ACCELERATE_DEBUG_MODE,
ACCELERATE_CPU_AFFINITY and ACCELERATE_LOG_LEVEL — they change how processes start or
what Accelerate logs, not how training runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from lerobot_kit.core.errors import ConfigError

OVERRIDE_ENV = "LEROBOT_ALLOW_ACCELERATE_ENV"
_TRUE = ("1", "true", "yes")

# Variables a plain `accelerate launch` sets itself: refused only when not at this value.
_NO_COMPILE = "no equivalent: lerobot-kit does not torch.compile through Accelerate"
_PLAIN_DEFAULTS: dict[str, tuple[str, str]] = {
    "ACCELERATE_MIXED_PRECISION": ("no", "--accelerator.mixed_precision=bf16|fp16"),
    "ACCELERATE_DYNAMO_BACKEND": ("no", _NO_COMPILE),
    "ACCELERATE_DYNAMO_MODE": ("default", _NO_COMPILE),
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": ("false", _NO_COMPILE),
    "ACCELERATE_DYNAMO_USE_DYNAMIC": ("false", _NO_COMPILE),
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": ("false", _NO_COMPILE),
}

# Variables no plain launch sets: refused whenever present. Exact names first.
_EXACT: dict[str, str] = {
    "ACCELERATE_USE_FSDP": "--parallelism.dp_shard=N (FSDP2) and --accelerator.fsdp.*",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "--parallelism.dp_replicate / --parallelism.dp_shard",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "--accelerator.gradient_accumulation.steps",
    "ACCELERATE_GRADIENT_CLIPPING": "--optimizer.grad_clip_norm",
    "ACCELERATE_USE_DEEPSPEED": "--parallelism.dp_shard=N (FSDP2; DeepSpeed is not supported)",
    "ACCELERATE_CONFIG_DS_FIELDS": "--parallelism.dp_shard=N (FSDP2; DeepSpeed is not supported)",
    "ACCELERATE_USE_MEGATRON_LM": "no equivalent: Megatron-LM is not supported",
    "ACCELERATE_DOWNCAST_BF16": "--accelerator.mixed_precision=bf16",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "--accelerator.fsdp.wrap_modules='[\"Block\"]'",
    "FSDP_AUTO_WRAP_POLICY": "--accelerator.fsdp.wrap_modules or --accelerator.fsdp.min_num_params",
    "FSDP_MIN_NUM_PARAMS": "--accelerator.fsdp.min_num_params",
    "FSDP_OFFLOAD_PARAMS": "--accelerator.fsdp.cpu_offload",
    "FSDP_RESHARD_AFTER_FORWARD": "--accelerator.fsdp.reshard_after_forward",
    "FSDP_IGNORED_MODULES": "--accelerator.fsdp.ignored_modules",
    "FSDP_SHARDING_STRATEGY": "--parallelism.dp_shard / --parallelism.dp_replicate",
    "FSDP_STATE_DICT_TYPE": "--checkpoint_format",
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "--parallelism.dp_replicate",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": "--parallelism.dp_shard",
}

# Then families by prefix (first match wins, so longer prefixes come first).
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("ACCELERATE_DEEPSPEED_", "--parallelism.dp_shard=N (FSDP2; DeepSpeed is not supported)"),
    ("ACCELERATE_FP8_", "--accelerator.mixed_precision=bf16|fp16 (fp8 is not supported)"),
    ("FSDP_", "--parallelism.dp_shard=N and --accelerator.fsdp.*"),
    ("PARALLELISM_CONFIG_", "--parallelism.dp_replicate / --parallelism.dp_shard (only data parallelism)"),
    ("MEGATRON_LM_", "no equivalent: Megatron-LM is not supported"),
)


def _instead(name: str, value: str) -> str | None:
    """The lerobot flag replacing ``name``, or None when ``name=value`` is harmless."""
    if name in _PLAIN_DEFAULTS:
        default, flag = _PLAIN_DEFAULTS[name]
        return None if value.strip().lower() == default else flag
    if name in _EXACT:
        return _EXACT[name]
    for prefix, flag in _PREFIXES:
        if name.startswith(prefix):
            return flag
    return None


def accelerate_env_offenders(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(name, value, lerobot flag)`` for every engine-configuring variable, sorted by name."""
    found = []
    for name in sorted(environ):
        flag = _instead(name, environ[name])
        if flag is not None:
            found.append((name, environ[name], flag))
    return found


def check_accelerate_env(environ: Mapping[str, str]) -> None:
    offenders = accelerate_env_offenders(environ)
    if not offenders or environ.get(OVERRIDE_ENV, "").strip().lower() in _TRUE:
        return
    lines = [
        "Accelerate engine settings are set in the environment, but lerobot-kit uses Accelerate only as a "
        "launcher and would ignore them (they come from `accelerate config`'s default_config.yaml or "
        "`accelerate launch --config_file`). Unset them and use the lerobot flags instead:"
    ]
    lines += [f"  {name}={value!r} -> {flag}" for name, value, flag in offenders]
    lines.append(f"(or set {OVERRIDE_ENV}=1 to start anyway and ignore them)")
    raise ConfigError("\n".join(lines))
