"""The checkpoint check's rules (``core.layout.file_rules``) accept exactly what the writers write.

Each rule is run on what the real writer produces (the loss scaler, the LR schedule, the
random state of every rank, the processors) and on that output damaged one way, so a
writer that changes its format breaks a test here instead of every resume.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from lerobot_kit.core.checkpoint.training_state import capture_rng, save_per_rank
from lerobot_kit.core.data.dataset import DatasetMeta, FeatureSpec
from lerobot_kit.core.layout import paths
from lerobot_kit.core.layout.file_rules import (
    dataset_meta_problems,
    param_groups_problems,
    processor_problems,
    rng_problems,
    scaler_problems,
    scheduler_problems,
)
from lerobot_kit.core.layout.safetensors_header import read_safetensors_header
from lerobot_kit.core.layout.validate import check_pretrained_folder
from lerobot_kit.core.model.processor import make_processors
from lerobot_kit.core.parallel.precision import LossScaler
from lerobot_kit.core.run.optim import ScheduleState
from lerobot_kit.plugins.policies.act.configuration import ACTConfig

META = DatasetMeta(
    {"observation.state": FeatureSpec("float32", (3,)), "action": FeatureSpec("float32", (2,))},
    {key: {"mean": np.zeros(n, np.float32), "std": np.ones(n, np.float32), "min": -np.ones(n, np.float32),
           "max": np.ones(n, np.float32)} for key, n in (("observation.state", 3), ("action", 2))},
    10, 2, 40,
)


def test_the_loss_scalers_state_and_damaged_ones() -> None:
    state = LossScaler(torch.device("cpu"), reduce=False).state_dict()
    assert scaler_problems(json.loads(json.dumps(state))) == []
    assert scaler_problems({**state, "scale": float("nan")}) == ["scale must be a finite number above 0, not nan"]
    assert scaler_problems({**state, "growth_interval": 0}) == ["growth_interval must be a positive integer, not 0"]
    assert scaler_problems([state]) == ["must be a JSON object, not a list"]


def test_the_schedules_state_and_damaged_ones() -> None:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = ScheduleState(scheduler).state_dict()
    assert scheduler_problems(json.loads(json.dumps(state))) == []
    assert scheduler_problems({**state, "last_epoch": -1}) == [
        "last_epoch must be a non-negative integer (the schedule's step), not -1"
    ]
    assert scheduler_problems({**state, "base_lrs": ["fast"]}) == [
        "base_lrs must be a list of learning rates (finite, 0 or more), not ['fast']"
    ]


def test_every_ranks_random_state_and_damaged_ones(tmp_path: Path) -> None:
    save_per_rank([capture_rng(), capture_rng()], tmp_path / paths.RNG_STATE)
    header = read_safetensors_header(tmp_path / paths.RNG_STATE)
    assert rng_problems(header) == []
    lacking = {k: v for k, v in header.items() if k != "rank1.numpy_gauss"}
    assert rng_problems(lacking) == ["rank 1's random state lacks numpy_gauss"]
    short = {**header, "rank0.python": {**header["rank0.python"], "shape": [600]}}
    assert rng_problems(short) == [
        "entry 'rank0.python' is I64 [600], but a saved random state is I64 [625]: it is truncated or not lerobot-kit's"
    ]
    assert rng_problems({k: v for k, v in header.items() if not k.startswith("rank0.")}) == [
        "holds no random state of rank 0"
    ]


def test_param_groups() -> None:
    groups = [{"lr": 1e-3, "betas": [0.9, 0.999], "params": ["a.weight", "a.bias"]}, {"params": ["b.weight"]}]
    assert param_groups_problems(groups) == []
    assert param_groups_problems([*groups, {"params": ["a.bias"]}]) == [
        "parameter a.bias is in more than one param group"
    ]
    assert param_groups_problems([{"params": "a.weight"}]) == [
        'param group 0: "params" must be a list of parameter names or indices'
    ]


def test_the_processors_a_policy_saves_and_their_references(tmp_path: Path) -> None:
    pre, post = make_processors(ACTConfig(), META)
    pre.save(tmp_path, paths.PREPROCESSOR)
    post.save(tmp_path, paths.POSTPROCESSOR)
    saved = json.loads((tmp_path / f"{paths.PREPROCESSOR}.json").read_text())
    assert processor_problems(saved, tmp_path, tmp_path) == []
    step = saved["steps"][0]
    for ref, expected in [
        ("../stats.safetensors", "is not the name of a .safetensors file in"),
        ("/etc/passwd", "is not the name of a .safetensors file in"),
        ("gone.safetensors", "refers to gone.safetensors, which is missing"),
    ]:
        [problem] = processor_problems({"steps": [{**step, "state_file": ref}]}, tmp_path, tmp_path)
        assert problem.startswith("step 0: ") and expected in problem, problem
    (tmp_path / "linked.safetensors").symlink_to(tmp_path.parent / "elsewhere.safetensors")
    [problem] = processor_problems({"steps": [{**step, "state_file": "linked.safetensors"}]}, tmp_path, tmp_path)
    assert "links outside the checkpoint" in problem


def test_dataset_meta_as_written_and_damaged() -> None:
    written = json.loads(json.dumps(META.to_json()))
    assert dataset_meta_problems(written) == []
    assert dataset_meta_problems({**written, "fps": "ten"}) == ["fps must be a non-negative integer, not 'ten'"]
    assert dataset_meta_problems({**written, "features": {"action": {"dtype": "float32"}}}) == [
        "feature 'action' must be an object with a dtype string and a shape (a list of sizes)"
    ]


def test_a_folder_save_pretrained_wrote_is_checked_within_itself(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / paths.POLICY_CONFIG).write_text(json.dumps({"type": "act"}))
    (folder / paths.DATASET_META).write_text(json.dumps(META.to_json()))
    save_file({"w": torch.zeros(2)}, folder / paths.ADAPTER_WEIGHTS)
    assert check_pretrained_folder(folder).problems == []
    # An adapter whose base is itself would load forever: a loop, named in one line.
    adapter = {"peft_type": "LORA", "base_model_name_or_path": str(folder)}
    (folder / paths.ADAPTER_CONFIG).write_text(json.dumps(adapter))
    [problem] = check_pretrained_folder(folder).problems
    assert problem.line == (
        f"policy/adapter_config.json: its base policy {folder} leads back to an adapter already on the way, a loop; "
        "put the base back, or edit base_model_name_or_path to where it now lives"
    )


def test_a_hub_snapshot_may_link_into_its_repos_blobs_and_nowhere_else(tmp_path: Path) -> None:
    """The Hub's cache holds a snapshot's files as links to ``../../blobs/<hash>``: the
    check reads them, and still refuses a link that leaves the repo's cache folder."""
    repo = tmp_path / "hub" / "models--someone--act"
    snapshot, blobs = repo / "snapshots" / ("c" * 40), repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    (blobs / "1234").write_text(json.dumps({"type": "act"}))
    (snapshot / paths.POLICY_CONFIG).symlink_to(Path("../../blobs/1234"))
    assert check_pretrained_folder(snapshot).problems == []
    (tmp_path / "secret.json").write_text("{}")
    (snapshot / "extra.json").symlink_to(tmp_path / "secret.json")
    [problem] = check_pretrained_folder(snapshot).problems
    assert problem.file == f"{'c' * 40}/extra.json" and "links outside the checkpoint" in problem.line
    plain = tmp_path / "plain"  # not in a Hub cache: the folder alone is the checkpoint
    plain.mkdir()
    (plain / paths.POLICY_CONFIG).symlink_to(blobs / "1234")
    [problem] = check_pretrained_folder(plain).problems
    assert problem.file == "plain/config.json" and "links outside the checkpoint" in problem.line
