"""The README's memory table: ``lerobot plan`` for LeRobot's π0.5 at its full default size
(SigLIP + gemma_2b + gemma_300m, 4.14 B parameters) in several layouts, offline.

Each row is what ``lerobot plan --world_size=N ... --plan.device_memory_gb=G --json``
prints, computed here in one process (LeRobot is imported once) by the same function
(``plan_run``): per-rank parameter + gradient + AdamW bytes, and the largest
``--batch_size`` whose step fits 80 GiB and 141 GiB per rank, with and without activation
checkpointing. No weights, no tokenizer and no network are needed; a dataset gives the
features (``--dataset.root``, e.g. the one ``toy_dataset.py`` writes). The LoRA rows
start from a ``--policy.path`` folder holding only LeRobot's ``config.json`` for π0.5
(a plan never reads weights).

    python tools/plan_table.py --dataset.root=DATA [--repo_id=bridge/reach]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

GIB = 2**30
# (label, world size, layout flags, policy/run flags)
SCENARIOS: list[tuple[str, int, list[str], list[str]]] = [
    ("full fine-tuning", 8, ["--parallelism.dp_shard=8"], []),
    ("train_expert_only", 8, ["--parallelism.dp_shard=8"], ["--policy.train_expert_only=true"]),
    ("LoRA r=16 (LeRobot's targets)", 8, ["--parallelism.dp_shard=8"], ["LORA"]),
    ("full fine-tuning", 16, ["--parallelism.dp_shard=16"], []),
    ("full fine-tuning", 16, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=8"], []),
    ("full fine-tuning", 64, ["--parallelism.dp_shard=64"], []),
    ("full fine-tuning", 64, ["--parallelism.dp_replicate=8", "--parallelism.dp_shard=8"], []),
]
DEVICES_GIB = (80, 141)


def lerobot_pi05_folder(target: Path) -> Path:
    """A ``pretrained_model/`` with only LeRobot's ``config.json`` for π0.5 at its defaults."""
    from lerobot.policies.pi05.configuration_pi05 import PI05Config

    target.mkdir(parents=True, exist_ok=True)
    PI05Config(device="cpu")._save_pretrained(target)
    return target


def plan(flags: list[str], world: int, device_gib: float) -> Any:
    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.plan.memory_plan import plan_run

    return plan_run(parse_train_config(flags), world, device_gib)


def rows(dataset: list[str], base: Path) -> list[str]:
    lines = [
        "| ranks | layout | training | params+grads+AdamW per rank | activations at batch 1 (no AC / AC) "
        "| largest batch 80 GiB (no AC / AC) | largest batch 141 GiB (no AC / AC) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, world, layout, extra in SCENARIOS:
        policy = ["--policy.type=lerobot_pi05", "--batch_size=1", "--accelerator.mixed_precision=bf16", *dataset]
        if extra == ["LORA"]:
            policy = [*policy, f"--policy.path={base}", "--peft.method_type=LORA", "--peft.r=16"]
        else:
            policy = [*policy, *extra]
        fits: dict[tuple[int, bool], int | None] = {}
        first = None
        for checkpointing in (False, True):
            flags = [*policy, *layout, f"--accelerator.activation_checkpointing={str(checkpointing).lower()}"]
            for device in DEVICES_GIB:
                result = plan(flags, world, device)
                first = first or result
                fit = result.activations.fit
                fits[(device, checkpointing)] = fit.largest if fit is not None else None
        sharding, activations = first.sharding, first.activations
        layout_name = f"{sharding.dims.layout.upper()} ({sharding.dims.dp_replicate}×{sharding.dims.dp_shard})"
        lines.append(
            f"| {world} | {layout_name} | {label} | {sharding.per_rank.total_bytes / GIB:.2f} GiB "
            f"| {activations.peak_bytes / GIB:.2f} / {activations.checkpointed_peak_bytes / GIB:.2f} GiB "
            + "".join(f"| {fits[(d, False)]} / {fits[(d, True)]} " for d in DEVICES_GIB) + "|"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset.root", dest="root", required=True)
    parser.add_argument("--repo_id", default="bridge/reach")
    args = parser.parse_args()
    dataset = [f"--dataset.repo_id={args.repo_id}", f"--dataset.root={args.root}"]
    with tempfile.TemporaryDirectory() as scratch:
        print("\n".join(rows(dataset, lerobot_pi05_folder(Path(scratch) / "pretrained_model"))))


if __name__ == "__main__":
    main()
