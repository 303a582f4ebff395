"""Synthetic checkpoints of layout 1, written as the trainer writes them, in a fraction of a second.

Real safetensors files and real DCP folders from ``torch.distributed.checkpoint``, a real
optimizer state after one AdamW step written by the trainer's own function, every rank's
random state as ``capture_rng`` takes it, the processors' files, the record as the
trainer's ``RunFacts`` builds it, and ``checksums.json``; tests then damage one thing. The
policy type is one no plugin declares shapes for, so the weights are loadable by the
manifest tying them to ``config.json``. What the trainer itself writes for the same kind of
checkpoint (gathered weights, DCP shards or both, a PEFT adapter, fp16's loss scaler) is
compared with these files, name for name and field for field, in
``tests/integration/test_state_pieces.py``. ``optimizer_keys="index"`` is the one option no
real saver matches: the trainer keys optimizer state by parameter name; index keys are
torch's own ``optimizer.state_dict()``, which the checks accept too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from lerobot_kit.core.checkpoint.state import RunFacts
from lerobot_kit.core.checkpoint.training_state import capture_rng, save_full_optimizer, save_per_rank
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.training_step import Topology
from lerobot_kit.core.layout.manifest import write_manifest

STEP = 500


def toy_model(seed: int = 0, hidden: int = 3) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))


def trained(model: torch.nn.Module) -> torch.optim.Optimizer:
    """One AdamW step under an LR schedule, so the optimizer has the state (and the param groups
    their ``initial_lr``) a real checkpoint holds."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return opt


def optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, keys: str = "fqn") -> dict[str, Any]:
    """The optimizer's state keyed by parameter FQN (as the trainer writes it) or by index."""
    osd = opt.state_dict()
    if keys == "index":
        return {"state": osd["state"], "param_groups": osd["param_groups"]}
    names = [n for n, _ in model.named_parameters()]
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": {names[i]: s for i, s in osd["state"].items()}, "param_groups": groups}


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2))


DATASET_META = {
    "features": {"observation.state": {"dtype": "float32", "shape": [4]}, "action": {"dtype": "float32", "shape": [2]}},
    "stats": {"action": {"mean": [0.0, 0.0], "std": [1.0, 1.0]}},
    "fps": 10,
    "num_episodes": 2,
    "num_frames": 40,
}


def write_checkpoint(
    run_dir: Path, *, weights: str = "gathered", optimizer: str = "safetensors", dp_shard: int = 1,
    peft: bool = False, mixed_precision: str = "no", optimizer_keys: str = "fqn", checksums: bool = True,
    step: int = STEP, last: bool = True,
) -> Path:
    """A layout-1 step folder of ``step`` under ``run_dir/checkpoints``, with its ``checksums.json``
    (unless ``checksums=False``) and ``last`` pointing at it (unless ``last=False``)."""
    step_dir = run_dir / L.CHECKPOINTS_DIR / L.step_dir_name(step)
    pre, state = step_dir / L.PRETRAINED_DIR, step_dir / L.TRAINING_STATE_DIR
    pre.mkdir(parents=True)
    state.mkdir()
    model = toy_model()
    if peft:  # the trainable adapter stands in for the model: the optimizer updates only it
        model = torch.nn.Sequential(torch.nn.Linear(4, 2, bias=False), torch.nn.Linear(2, 4, bias=False))
    opt = trained(model)
    weights_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}

    write_json(pre / L.POLICY_CONFIG, {"type": "toy", "hidden": 3})
    write_json(pre / L.TRAIN_CONFIG, {"policy": {"type": "act"}, "dataset": {"type": "reach"}, "steps": 1000})
    write_json(pre / "dataset_meta.json", DATASET_META)
    if "gathered" in weights:
        if peft:
            save_file(weights_sd, pre / L.ADAPTER_WEIGHTS)
            write_json(pre / L.ADAPTER_CONFIG, {"peft_type": "LORA", "r": 2,
                                                "base_model_name_or_path": str(write_base(run_dir / "base"))})
        else:
            save_file(weights_sd, pre / L.MODEL_WEIGHTS)
    if "dcp" in weights:
        dcp.save(weights_sd, checkpoint_id=pre / L.DCP_MODEL_DIR, no_dist=True)
    for proc, kind in ((L.PREPROCESSOR, "normalize"), (L.POSTPROCESSOR, "unnormalize")):
        stats = f"{proc}_step_0_{kind}.safetensors"
        steps = [{"registry_name": kind, "config": {"modes": {"action": "mean_std"}}, "state_file": stats}]
        write_json(pre / f"{proc}.json", {"name": proc, "steps": steps})
        save_file({"action.mean": torch.zeros(2), "action.std": torch.ones(2)}, pre / stats)

    optimizer_sd = optimizer_state(model, opt, optimizer_keys)
    if optimizer == "safetensors":
        save_full_optimizer(optimizer_sd, state)
    else:
        dcp.save(optimizer_sd, checkpoint_id=state / L.DCP_OPTIMIZER_DIR, no_dist=True)
    world = 2
    save_per_rank([capture_rng() for _ in range(world)], state / L.RNG_STATE)
    write_json(state / L.SCHEDULER_STATE, {"last_epoch": step, "base_lrs": [1e-3]})
    if mixed_precision == "fp16":
        write_json(state / L.SCALER_STATE, {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                            "growth_interval": 2000, "growth_tracker": 7})
    facts = RunFacts(
        checkpoint_format={"gathered": "safetensors", "dcp": "dcp", "gathered+dcp": "safetensors_dcp"}[weights],
        topology=Topology(world, world // dp_shard, dp_shard, "ddp" if dp_shard == 1 else "fsdp"),
        batch_size=8, gradient_accumulation_steps=1, mixed_precision=mixed_precision, peft=peft,
    )
    recorded = {"weights": weights, "optimizer": optimizer, "sampler": {"epoch": 3, "offset": 16, "samples_seen": 4016}}
    write_json(state / L.TRAINING_STEP, facts.record(step, recorded).to_json())
    if checksums:
        write_manifest(step_dir)
    if last:
        os.symlink(step_dir.name, run_dir / L.CHECKPOINTS_DIR / L.LAST_LINK)
    return step_dir


def write_base(folder: Path) -> Path:
    """The plain policy folder an adapter names as its base (``config.json`` and full weights)."""
    folder.mkdir(parents=True)
    write_json(folder / L.POLICY_CONFIG, {"type": "toy", "hidden": 3})
    save_file(toy_model().state_dict(), folder / L.MODEL_WEIGHTS)
    return folder


