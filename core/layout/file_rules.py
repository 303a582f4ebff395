"""One rule per kind of checkpoint file: the problems of its parsed value, one line each.

``core.layout.validate`` applies them to every file of a checkpoint before anything reads
it, for the loaders and ``inspect-checkpoint`` alike; a loader that reads one file on its
own (``PolicyProcessor.load``, ``recorded_base``) applies the same rule. The rules
describe what lerobot-kit writes: the learning-rate schedule and the loss scaler as the run
saves them (``last_epoch`` and ``base_lrs``; ``scale``, its factors and counters), the
random state of every rank as ``core.checkpoint.training_state`` captures it, the
processors as ``PolicyProcessor.save`` writes them, and peft's ``adapter_config.json`` of a
method lerobot-kit trains, on a base that loads. Lines name no file: the caller adds it.
Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath
from typing import Any

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.json_file import json_type, read_json
from lerobot_kit.core.layout.safetensors_header import tensors
from lerobot_kit.core.layout.stored_weights import StoredWeights

# The PEFT methods lerobot-kit trains, as adapter_config.json's peft_type spells them,
# and the peft config class of each.
PEFT_METHODS: dict[str, str] = {"LORA": "LoraConfig", "LOHA": "LoHaConfig", "LOKR": "LoKrConfig", "IA3": "IA3Config"}

# One rank's random state (``rank<r>.<name>``): dtype and shape as torch, numpy and Python keep it.
RNG_ENTRIES: dict[str, tuple[str, list[int]]] = {
    "torch": ("U8", [5056]),  # the CPU generator's state
    "numpy": ("I64", [624]),  # MT19937 keys
    "numpy_extra": ("I64", [2]),  # position, has_gauss
    "numpy_gauss": ("F64", [1]),
    "python": ("I64", [625]),  # random.getstate()'s internal tuple
    "python_extra": ("I64", [1]),  # its version
    "python_gauss": ("F64", [1]),
}
CUDA_RNG = "cuda"  # the current GPU's generator, when there was one: bytes whose length torch decides

OUTSIDE = "nothing outside a checkpoint is read through it: copy the file in instead of linking it"


def no_rule(value: Any) -> list[str]:
    """Files the layout does not describe (extra JSON a user added): parsing is their only check."""
    return []


def object_problems(value: Any) -> list[str]:
    return [] if isinstance(value, dict) else [f"must be a JSON object, not {json_type(value)}"]


def policy_config_problems(value: Any) -> list[str]:
    """``config.json``: its policy's own config, of which loading first needs the ``type``."""
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        return []
    line = 'must be a JSON object with a "type" string'
    return [line if isinstance(value, dict) else f"{line}, not {json_type(value)}"]


def dataset_meta_problems(value: Any) -> list[str]:
    """``dataset_meta.json``: the features the policy was built for, their stats, and counts."""
    if not isinstance(value, dict):
        return [f"must be a JSON object, not {json_type(value)}"]
    found = []
    features = value.get("features")
    if not isinstance(features, dict):
        found.append(f'"features" must be an object of features, not {_shown(features)}')
    else:
        for key, spec in features.items():
            if not _is_feature(spec):
                found.append(f"feature {key!r} must be an object with a dtype string and a shape (a list of sizes)")
                break
    stats = value.get("stats")
    if not (isinstance(stats, dict) and all(
            isinstance(s, dict) and all(_is_numbers(v) for v in s.values()) for s in stats.values())):
        found.append('"stats" must be an object of per-feature objects of numbers (or lists of them)')
    for key in ("fps", "num_episodes", "num_frames"):
        if not _is_count(value.get(key)):
            found.append(f"{key} must be a non-negative integer, not {_shown(value.get(key))}")
    return found


def adapter_config_problems(value: Any) -> list[str]:
    """``adapter_config.json`` (peft's own): a method lerobot-kit trains, and a base that loads."""
    if not isinstance(value, dict):
        return [f"must be a JSON object, not {json_type(value)}"]
    peft_type = value.get("peft_type")
    if peft_type not in PEFT_METHODS:
        return [f"peft_type is {_shown(peft_type)}, not a PEFT method lerobot-kit loads ({', '.join(PEFT_METHODS)})"]
    base = value.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        return ["records no base_model_name_or_path, so the base policy is unknown"]
    problem = base_problem(Path(base))
    return [problem] if problem else []


def base_problem(base: Path, _seen: frozenset[Path] = frozenset()) -> str | None:
    """Why the base policy an adapter names cannot be loaded under it, or None.

    Loading reads the base's ``config.json`` and its one weights file: a folder that is
    gone, that holds only DCP shards, or that is itself an adapter whose bases lead back
    to it does not load. The base's other files are checked when it is loaded.
    """
    fix = "put the base back, or edit base_model_name_or_path to where it now lives"
    if not (base / L.POLICY_CONFIG).is_file():
        return f"its base policy {base} is gone (no {L.POLICY_CONFIG} there); {fix}"
    where = base.resolve()
    if where in _seen:
        return f"its base policy {base} leads back to an adapter already on the way, a loop; {fix}"
    try:
        stored = StoredWeights.of(base)
        stored.gathered_file()
    except CheckpointError as err:
        return f"its base policy {base} does not load: {err}"
    if not stored.adapter:
        return None
    try:
        outer = read_json(base / L.ADAPTER_CONFIG)
    except CheckpointError as err:
        return f"its base policy {base} is an adapter whose config is unreadable: {err}"
    inner = outer.get("base_model_name_or_path") if isinstance(outer, dict) else None
    if not isinstance(inner, str) or not inner:
        return f"its base policy {base} is an adapter that records no base of its own"
    return base_problem(Path(inner), _seen | {where})


def processor_problems(value: Any, folder: Path, inside: Path) -> list[str]:
    """A processor pipeline (``policy_preprocessor.json``, ...): a list of steps, each an
    object whose ``state_file`` is a safetensors file of ``folder`` itself."""
    if not isinstance(value, dict) or not isinstance(value.get("steps"), list):
        return [f'must be a JSON object with a "steps" list, not {_shown(value)}']
    found = []
    for i, step in enumerate(value["steps"]):
        if not isinstance(step, dict):
            found.append(f"step {i} must be an object, not {json_type(step)}")
            continue
        if not isinstance(step.get("registry_name", ""), str):
            found.append(f"step {i}: registry_name must be a string, not {_shown(step['registry_name'])}")
        if not isinstance(step.get("config", {}), dict):
            found.append(f"step {i}: config must be an object, not {json_type(step['config'])}")
        ref = step.get("state_file")
        if ref is not None:
            problem = _state_file_problem(ref, folder, inside)
            if problem:
                found.append(f"step {i}: {problem}")
    return found


def _state_file_problem(ref: Any, folder: Path, inside: Path) -> str | None:
    if not isinstance(ref, str) or not ref.endswith(".safetensors") or PurePosixPath(ref).name != ref or "\\" in ref:
        return (f"state_file {ref!r} is not the name of a .safetensors file in {folder.name}/; {OUTSIDE}"
                if isinstance(ref, str) else f"state_file must be a file name, not {json_type(ref)}")
    path = folder / ref
    if not L.resolves_inside(path, inside):
        return f"state_file {ref} links outside the checkpoint (to {L.link_target(path)}); {OUTSIDE}"
    if not path.is_file():
        return f"refers to {ref}, which is missing"
    return None


def scheduler_problems(value: Any) -> list[str]:
    """``scheduler_state.json``: where the learning-rate schedule stood, and its base rates."""
    if not isinstance(value, dict):
        return [f"must be a JSON object, not {json_type(value)}"]
    found = []
    epoch = value.get("last_epoch")
    if not _is_count(epoch):
        found.append(f"last_epoch must be a non-negative integer (the schedule's step), not {_shown(epoch)}")
    rates = value.get("base_lrs")
    if not (isinstance(rates, list) and rates and all(_is_finite(r) and r >= 0 for r in rates)):
        found.append(f"base_lrs must be a list of learning rates (finite, 0 or more), not {_shown(rates)}")
    return found


def scaler_problems(value: Any) -> list[str]:
    """``scaler_state.json``: the fp16 loss scale, its growth and back-off, and their counters."""
    if not isinstance(value, dict):
        return [f"must be a JSON object, not {json_type(value)}"]
    found = []
    for key in ("scale", "growth_factor", "backoff_factor"):
        if not (_is_finite(value.get(key)) and value[key] > 0):
            found.append(f"{key} must be a finite number above 0, not {_shown(value.get(key))}")
    if not (_is_count(value.get("growth_interval")) and value["growth_interval"] > 0):
        found.append(f"growth_interval must be a positive integer, not {_shown(value.get('growth_interval'))}")
    if not _is_count(value.get("growth_tracker")):
        found.append(f"growth_tracker must be a non-negative integer, not {_shown(value.get('growth_tracker'))}")
    return found


def param_groups_problems(value: Any) -> list[str]:
    """``optimizer_param_groups.json``: a list of groups, each listing its parameters, none in two groups."""
    if not isinstance(value, list) or not all(isinstance(g, dict) for g in value):
        return [f"must be a JSON list of param groups (objects), not {json_type(value)}"]
    found = []
    seen: set[str] = set()
    for i, group in enumerate(value):
        params = group.get("params")
        if not isinstance(params, list) or not all(isinstance(p, str) or _is_count(p) for p in params):
            return [f'param group {i}: "params" must be a list of parameter names or indices']
        if "betas" in group and not (isinstance(group["betas"], list) and all(_is_finite(b) for b in group["betas"])):
            found.append(f"param group {i}: betas must be a list of numbers, not {_shown(group['betas'])}")
        members = {str(p) for p in params}
        twice = seen & members
        if twice:
            found.append(f"parameter {min(twice, key=natural)} is in more than one param group")
        seen |= members
    return found


def group_members(value: Any) -> set[str] | None:
    """The parameters (FQNs, or indices as strings) valid param groups list; None when they are not valid."""
    if param_groups_problems(value):
        return None
    return {str(p) for group in value for p in group["params"]}


def rng_problems(header: dict[str, Any]) -> list[str]:
    """``rng_state.safetensors``: every rank's random state whole, as a resume restores it."""
    per_rank: dict[int, set[str]] = {}
    for name, entry in tensors(header).items():
        rank, _, key = name.partition(".")
        if not (rank.startswith("rank") and rank[4:].isdigit() and (key in RNG_ENTRIES or key == CUDA_RNG)):
            return [f"unexpected entry {name!r} (expected rank<r>.<{'|'.join([*RNG_ENTRIES, CUDA_RNG])}>)"]
        dtype, shape = entry["dtype"], entry["shape"]
        expected = RNG_ENTRIES.get(key)
        if expected is None:  # cuda: bytes of any length torch's GPU generator keeps
            fits = dtype == "U8" and len(shape) == 1 and shape[0] > 0
            expected_text = "U8 [n]"
        else:
            fits = (dtype, shape) == expected
            expected_text = f"{expected[0]} {expected[1]}"
        if not fits:
            return [(f"entry {name!r} is {dtype} {shape}, but a saved random state is {expected_text}: it is "
                     "truncated or not lerobot-kit's")]
        per_rank.setdefault(int(rank[4:]), set()).add(key)
    if 0 not in per_rank:
        return ["holds no random state of rank 0"]
    for rank, keys in sorted(per_rank.items()):
        lacking = [key for key in RNG_ENTRIES if key not in keys]
        if lacking:
            return [f"rank {rank}'s random state lacks {', '.join(lacking)}"]
    return []


# --- small helpers ------------------------------------------------------------------------


def natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 62, key)


def _is_feature(spec: Any) -> bool:
    """A feature of ``dataset_meta.json``: a dtype and a shape (a list of sizes)."""
    return (isinstance(spec, dict) and isinstance(spec.get("dtype"), str) and isinstance(spec.get("shape"), list)
            and all(_is_count(d) for d in spec["shape"]))


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_numbers(value: Any) -> bool:
    """A number, or a (nested) list of numbers: a stat of any shape."""
    if isinstance(value, list):
        return all(_is_numbers(v) for v in value)
    return type(value) in (int, float)


def _shown(value: Any) -> str:
    """A value as a message shows it: short, and ``missing`` for an absent key."""
    if value is None:
        return "missing (or null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
