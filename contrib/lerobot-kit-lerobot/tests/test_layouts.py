"""LeRobot's ACT in every data-parallel layout, on CPU/gloo: one process, DDP(2) and
HSDP(2x2) (FSDP(2) is in test_act), each checkpoint used by LeRobot."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import ACTION_DIM, TINY_ACT, losses, train
from lerobot_side import act_on, assert_same_weights, load_with_lerobot, observation


@pytest.mark.parametrize(
    ("layout", "nproc", "flags"),
    [
        ("single", 1, ["--batch_size=8"]),
        ("ddp", 2, ["--batch_size=4"]),
        ("hsdp", 4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--batch_size=2"]),
    ],
)
def test_each_layout_trains_and_lerobot_runs_its_checkpoint(
    work: Path, dataset_root: Path, layout: str, nproc: int, flags: list[str]
) -> None:
    out = work / f"act_{layout}"
    result = train(work, *TINY_ACT, *flags, f"--output_dir={out}", "--steps=2", "--log_freq=1", nproc=nproc,
                   root=dataset_root)
    assert f"layout {layout} | world {nproc}" in result.stderr
    assert "effective batch 8" in result.stderr and len(losses(out)) == 2
    pretrained = out / "checkpoints" / "000002" / "pretrained_model"
    policy, preprocessor, postprocessor = load_with_lerobot(pretrained, "act")
    assert_same_weights(policy, load_file(pretrained / "model.safetensors"))
    action = act_on(policy, preprocessor, postprocessor, observation(dataset_root, 1))
    assert action.shape == (1, ACTION_DIM) and action.isfinite().all()
