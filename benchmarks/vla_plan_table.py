"""The LeRobot bridge README's memory tables: ``lerobot plan`` for LeRobot's π0.5 (SigLIP +
gemma_2b + gemma_300m, 4.14 B parameters) or SmolVLA (SmolVLM2-500M's first 16 layers and
an expert, 0.45 B) at their full default sizes in several layouts, offline.

Each row holds what ``lerobot plan --world_size=N ... --plan.device_memory_gb=G`` prints,
from the same functions (``plan_model`` for the per-rank bytes, ``StepTracer`` for the
activations of a traced step, ``largest_batch`` for the fit), in one process: LeRobot is
imported once, and a training mode's traces (activations at each batch size, which the
layout does not change) are shared by its rows. No weights, no tokenizer and no network
are needed; a dataset gives the features (``--dataset.root``, e.g. the one the bridge's
``tools/toy_dataset.py`` writes). Needs LeRobot and the bridge: run it with the python of
the venv ``contrib/lerobot-kit-lerobot/ci.sh`` builds. The LoRA row starts from a ``--policy.path`` folder holding
only LeRobot's ``config.json`` for the policy at its defaults (a plan never reads weights).

    $VENV/bin/python benchmarks/vla_plan_table.py --dataset.root=DATA [--repo_id=bridge/reach] [--policy=smolvla]
        [--json benchmarks/results/cpu-vla-plan-smolvla.json]

``--json`` writes the rows' raw figures with the date, machine and versions: the bridge
README's tables are rendered from those files by ``benchmarks/render_docs.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import result_header
from render_docs import PLAN_TABLE_HEADER, plan_table_row

GIB = 2**30
DEVICES_GIB = (80, 141)
COMMON = ["--batch_size=1", "--accelerator.mixed_precision=bf16"]
# training mode -> its flags, and the layouts it is planned in: (world size, layout flags)
LAYOUTS = {
    8: [["--parallelism.dp_shard=8"]],
    16: [["--parallelism.dp_shard=16"], ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=8"]],
    64: [["--parallelism.dp_shard=64"], ["--parallelism.dp_replicate=8", "--parallelism.dp_shard=8"]],
}
Modes = dict[str, tuple[list[str], dict[int, list[list[str]]]]]
LORA = "LoRA r=16, LeRobot's targets"
# LeRobot type -> its training modes. π0.5 fine-tunes everything by default, SmolVLA only its expert.
MODES: dict[str, Modes] = {
    "pi05": {
        "full fine-tuning": ([], LAYOUTS),
        "train_expert_only": (["--policy.train_expert_only=true"], {8: LAYOUTS[8]}),
        LORA: (["LORA"], {8: LAYOUTS[8]}),
    },
    "smolvla": {
        "full fine-tuning": (["--policy.train_expert_only=false"], LAYOUTS),
        "train_expert_only (LeRobot's default)": ([], LAYOUTS),
        LORA: (["LORA"], {8: LAYOUTS[8]}),
    },
}


def lerobot_config_folder(lerobot_type: str, target: Path) -> Path:
    """A ``pretrained_model/`` with only LeRobot's ``config.json`` for the type at its defaults."""
    from lerobot.policies.factory import make_policy_config

    target.mkdir(parents=True, exist_ok=True)
    make_policy_config(lerobot_type, device="cpu")._save_pretrained(target)
    return target


class Traced:
    """A step's activation bytes by batch size, each traced once."""

    def __init__(self, tracer: Any) -> None:
        self.tracer, self.bytes = tracer, {}

    def __call__(self, batch_size: int) -> int:
        if batch_size not in self.bytes:
            self.bytes[batch_size] = self.tracer.peak_bytes(batch_size)
        return self.bytes[batch_size]


def built_run(flags: list[str], world: int) -> tuple[Any, Any, Any]:
    """(spec, dataset meta, the model on meta with its units), as ``plan_run`` assembles them."""
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.data.build import build_dataset
    from lerobot_kit.core.run.assemble import build_model
    from lerobot_kit.core.run.spec import resolve_run

    config = parse_train_config(flags)
    spec = resolve_run(config, world)
    meta = build_dataset(config).meta
    return spec, meta, build_model(spec, meta, torch.device("meta"))


def traces(spec: Any, meta: Any, built: Any) -> tuple[Callable[[int], int], Callable[[int], int]]:
    """Activation bytes by batch size without and with activation checkpointing."""
    from lerobot_kit.core.model.processor import make_processors
    from lerobot_kit.core.parallel.precision import autocast_dtype
    from lerobot_kit.core.plan.activation_memory import StepTracer, TrainStep, item_shapes, policy_inputs

    config = spec.config
    item = {**item_shapes(meta, config.policy.delta_indices()), **policy_inputs(config.policy)}
    preprocessor, _ = make_processors(config.policy, meta)  # what plan_run traces for a policy with plan_inputs
    step = TrainStep(built.model, preprocessor, item, autocast_dtype(config.accelerator), None)
    return Traced(StepTracer(step, None)), Traced(StepTracer(step, built.wrap.paths, built.wrap.groups))


def rows(lerobot_type: str, dataset: list[str], base: Path) -> list[dict[str, Any]]:
    """One row per (training mode, layout): the raw figures of its plan."""
    from lerobot_kit.core.plan.batch_fit import largest_batch
    from lerobot_kit.core.plan.memory_plan import plan_model

    found = []
    for label, (extra, layouts) in MODES[lerobot_type].items():
        mode = [f"--policy.path={base}", "--peft.method_type=LORA", "--peft.r=16"] if extra == ["LORA"] else extra
        plain = checkpointed = None
        for world, flag_sets in layouts.items():
            for layout in flag_sets:
                policy = [f"--policy.type=lerobot_{lerobot_type}", *COMMON]
                spec, meta, built = built_run([*policy, *dataset, *mode, *layout], world)
                if plain is None:
                    plain, checkpointed = traces(spec, meta, built)
                sharding = plan_model(built.model, spec.dims, spec.config.accelerator, built.wrap)
                fits = {
                    (device, name): largest_batch(trace, sharding.device_bytes, device * GIB).largest
                    for device in DEVICES_GIB for name, trace in (("plain", plain), ("ac", checkpointed))
                }
                dims = sharding.dims
                found.append({
                    "ranks": world, "layout": dims.layout, "dp_replicate": dims.dp_replicate,
                    "dp_shard": dims.dp_shard, "training": label, "flags": [*mode, *layout],
                    "trainable_params": sharding.trainable_params,
                    "per_rank_state_bytes": sharding.per_rank.total_bytes,
                    "activation_bytes_batch1": {"plain": plain(1), "checkpointed": checkpointed(1)},
                    "largest_batch": {str(device): {"plain": fits[(device, "plain")], "checkpointed": fits[(device, "ac")]}
                                      for device in DEVICES_GIB},
                })
                print(plan_table_row(found[-1]), file=sys.stderr, flush=True)  # progress: a row takes a while
    return found


def result_file(lerobot_type: str, found: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``--json`` writes: the command, date, machine and versions, and the rows."""
    return {
        **result_header("benchmarks/vla_plan_table.py", sys.argv[1:]),
        "plan": {"policy": lerobot_type, "batch_size_flags": COMMON, "devices_gib": list(DEVICES_GIB), "rows": found},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset.root", dest="root", required=True)
    parser.add_argument("--repo_id", default="bridge/reach")
    parser.add_argument("--policy", choices=sorted(MODES), default="pi05", help="LeRobot's policy type")
    parser.add_argument("--json", dest="json_path", type=Path, help="also write the raw figures to this file")
    args = parser.parse_args()
    dataset = [f"--dataset.repo_id={args.repo_id}", f"--dataset.root={args.root}"]
    with tempfile.TemporaryDirectory() as scratch:
        found = rows(args.policy, dataset, lerobot_config_folder(args.policy, Path(scratch) / "pretrained_model"))
    print("\n".join([PLAN_TABLE_HEADER, *map(plan_table_row, found)]))
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(result_file(args.policy, found), indent=1) + "\n")


if __name__ == "__main__":
    main()
