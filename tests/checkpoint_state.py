"""Reading a run's checkpoints and metrics whole, to compare two runs bit for bit.

Shared by the resume tests: a checkpoint's full weights and optimizer state, whatever
format wrote them (gathered files or DCP shards, merged here with torch's own reader),
and a copy of a run as it stood right after one of its saves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from conftest import read_metrics
from lerobot_kit.core.checkpoint.training_state import load_full_optimizer


def full_weights(pretrained: Path, workdir: Path) -> dict[str, torch.Tensor]:
    """The full weights a ``pretrained_model/`` holds: its gathered file, else its shards merged."""
    gathered = pretrained / "model.safetensors"
    if gathered.is_file():
        return load_file(gathered)
    target = workdir / f"weights_{abs(hash(str(pretrained)))}.pt"
    dcp_to_torch_save(str(pretrained / "pytorch_model_fsdp_0"), str(target))
    return torch.load(target, weights_only=True)


def full_optimizer(state_dir: Path, workdir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The full optimizer state (by parameter name) a ``training_state/`` holds."""
    shards = state_dir / "optimizer_0"
    if not shards.is_dir():
        return load_full_optimizer(state_dir)["state"]
    target = workdir / f"optim_{abs(hash(str(state_dir)))}.pt"
    dcp_to_torch_save(str(shards), str(target))
    return torch.load(target, weights_only=True)["state"]


def crashed_copy(run: Path, step: int, dest: Path) -> Path:
    """A copy of ``run`` as it stood right after saving ``step``, as if it had crashed then:
    later checkpoints and logged metrics removed, ``last`` pointing at ``step``."""
    shutil.copytree(run, dest, symlinks=True)
    root = dest / "checkpoints"
    for folder in root.iterdir():
        if folder.name != "last" and int(folder.name) > step:
            shutil.rmtree(folder)
    (root / "last").unlink()
    (root / "last").symlink_to(f"{step:06d}")
    metrics = dest / "logs" / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= step]
    metrics.write_text("".join(line + "\n" for line in kept))
    return dest


def losses(run: Path, after: int = 0) -> list[float]:
    """The logged losses of the steps after ``after``."""
    return [m["loss"] for m in read_metrics(run) if m["step"] > after]


def assert_same_state(a: Path, b: Path, workdir: Path) -> None:
    """Step folders ``a`` and ``b`` hold bit-identical weights and optimizer state."""
    wa, wb = full_weights(a / "pretrained_model", workdir), full_weights(b / "pretrained_model", workdir)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"weight {key} differs"
    oa, ob = full_optimizer(a / "training_state", workdir), full_optimizer(b / "training_state", workdir)
    assert oa.keys() == ob.keys()
    for fqn in oa:
        for key in oa[fqn]:
            assert torch.equal(oa[fqn][key], ob[fqn][key]), f"optimizer {fqn}.{key} differs"
