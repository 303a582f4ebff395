"""A damaged checkpoint is refused alike by ``inspect-checkpoint``, the resume, ``--policy.path`` and ``lerobot eval``.

One tiny one-process run is saved once; each case copies it, damages one file (or the
``last`` link) as a disk fault, a copy gone wrong or a hand edit would, and runs
``lerobot``: the installed ``inspect-checkpoint`` reports the problem as one line naming
the file (exit 1), and the resume refuses with that very line (exit 1, before any model is
built), as does ``lerobot eval`` when loading reads the file. Nothing is written into the
run, and no command prints a traceback or exits as a bug (70). The run, the resumes and
the evals go through the CLI's entry point in the one-rank pool (``pool_cli``: the same
errors and exit codes, without a torch import per command); ``test_cli_errors.py`` holds
the console script's own exit path.

Groups: contents that used to end in tracebacks; verdicts inspect used to get wrong (both
ways); links that lead out of the checkpoint; and ``lerobot eval`` of a policy whose actions
are NaN, which writes nothing and leaves the rerun free.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import TINY_ACT, launch_env, pool_cli, pool_train, run_cli
from safetensors.torch import load_file, save_file

from lerobot_kit.core.layout.files import resume_advice
from lerobot_kit.core.layout.manifest import MANIFEST, write_manifest

SMALL_DATA = ["--dataset.num_episodes=2", "--dataset.episode_length=20"]
STEP = "checkpoints/000002"
P, T = "pretrained_model", "training_state"
LOAD_ADVICE = "load an earlier step folder of the run"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, rank_pools) -> Path:
    """A one-process run of 2 steps, saved at step 2."""
    root = tmp_path_factory.mktemp("validation")
    out = root / "run"
    pool_train(rank_pools, 1, f"--output_dir={out}", *TINY_ACT, *SMALL_DATA, "--batch_size=8", "--steps=2",
               "--save_freq=2", workdir=root)
    return out


# --- damage, one function per case: (step folder, scratch folder) -> the problem inspect names ------


def edit_json(path: Path, change: Callable[[object], object]) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def unverified(step: Path) -> None:
    """As a checkpoint written before checksums: the check of the contents, not the manifest, speaks."""
    (step / MANIFEST).unlink()


def negative_sampler_offset(step: Path, scratch: Path) -> str:
    edit_json(step / T / "training_step.json", lambda d: {**d, "sampler": {**d["sampler"], "offset": -5}})
    unverified(step)
    return f"{T}/training_step.json: sampler.offset is -5, which is out of range (a data position is never negative)"


def truncated_rng_entry(step: Path, scratch: Path) -> str:
    rng = step / T / "rng_state.safetensors"
    tensors = load_file(rng)
    tensors["rank0.torch"] = tensors["rank0.torch"][:100].clone()
    save_file(tensors, rng)
    write_manifest(step)  # the manifest vouches for the bytes: only the check of the contents can tell
    return (f"{T}/rng_state.safetensors: entry 'rank0.torch' is U8 [100], but a saved random state is U8 [5056]: "
            "it is truncated or not lerobot-kit's")


def text_last_epoch(step: Path, scratch: Path) -> str:
    edit_json(step / T / "scheduler_state.json", lambda d: {**d, "last_epoch": "two"})
    unverified(step)
    return f"{T}/scheduler_state.json: last_epoch must be a non-negative integer (the schedule's step), not 'two'"


def processor_steps_not_objects(step: Path, scratch: Path) -> str:
    edit_json(step / P / "policy_preprocessor.json", lambda d: {**d, "steps": ["normalize"]})
    unverified(step)
    return f"{P}/policy_preprocessor.json: step 0 must be an object, not a string"


def corrupt_processor_state(step: Path, scratch: Path) -> str:
    (step / P / "policy_preprocessor_step_0_normalize.safetensors").write_bytes(b"not a safetensors file")
    unverified(step)
    return f"{P}/policy_preprocessor_step_0_normalize.safetensors: not a safetensors file: header length field reads"


def config_that_is_a_list(step: Path, scratch: Path) -> str:
    (step / P / "config.json").write_text("[1, 2]")
    unverified(step)
    return f'{P}/config.json: must be a JSON object with a "type" string, not a list'


def as_adapter(step: Path, base: Path, peft_type: str = "LORA") -> None:
    """The step folder as a PEFT run's: its weights stand in for the adapter on ``base``."""
    (step / P / "model.safetensors").rename(step / P / "adapter_model.safetensors")
    (step / P / "adapter_config.json").write_text(
        json.dumps({"peft_type": peft_type, "base_model_name_or_path": str(base), "r": 4})
    )
    edit_json(step / T / "training_step.json", lambda d: {**d, "peft": True})
    write_manifest(step)


def unknown_peft_type(step: Path, scratch: Path) -> str:
    base = scratch / "base"
    shutil.copytree(step / P, base)
    as_adapter(step, base, peft_type="PROMPT_TUNING")
    return (f"{P}/adapter_config.json: peft_type is 'PROMPT_TUNING', not a PEFT method lerobot-kit loads "
            "(LORA, LOHA, LOKR, IA3)")


def looping_last(step: Path, scratch: Path) -> str:
    link = step.parent / "last"
    link.unlink()
    link.symlink_to("last")
    return f"{link}: a symbolic link that loops; point it at a step folder of this run"


def two_param_groups(step: Path, scratch: Path) -> str:
    edit_json(step / T / "optimizer_param_groups.json",
              lambda groups: [*groups, {**groups[0], "params": groups[0]["params"][:1]}])
    write_manifest(step)
    first = json.loads((step / T / "optimizer_param_groups.json").read_text())[0]["params"][0]
    return f"{T}/optimizer_param_groups.json: parameter {first} is in more than one param group"


def step_differs_from_folder(step: Path, scratch: Path) -> str:
    edit_json(step / T / "training_step.json", lambda d: {**d, "step": 7})
    write_manifest(step)
    return f"{T}/training_step.json: step is 7, but the folder is 000002"


def optimizer_state_of_a_renamed_parameter(step: Path, scratch: Path) -> str:
    groups_file, state_file = step / T / "optimizer_param_groups.json", step / T / "optimizer_state.safetensors"
    groups = json.loads(groups_file.read_text())
    old = groups[0]["params"][0]
    groups[0]["params"][0] = "renamed.weight"
    groups_file.write_text(json.dumps(groups))
    state = {name.replace(f"state.{old}.", "state.renamed.weight."): t for name, t in load_file(state_file).items()}
    save_file(state, state_file)
    write_manifest(step)
    return (f"{T}/optimizer_param_groups.json: lists parameter renamed.weight, which {P}/model.safetensors does not "
            "hold: the optimizer state is not this model's")


def weights_file_that_is_a_folder(step: Path, scratch: Path) -> str:
    (step / P / "model.safetensors").unlink()
    (step / P / "model.safetensors").mkdir()
    unverified(step)
    return (f"{P}/model.safetensors: a folder, not a file (training_state/training_step.json says peft: false, "
            "weights: gathered)")


def peft_base_gone(step: Path, scratch: Path) -> str:
    as_adapter(step, scratch / "gone")
    return (f"{P}/adapter_config.json: its base policy {scratch / 'gone'} is gone (no config.json there); put the "
            "base back, or edit base_model_name_or_path to where it now lives")


def peft_base_of_dcp_shards_only(step: Path, scratch: Path) -> str:
    base_step = scratch / "base" / "000002"
    shutil.copytree(step, base_step)
    as_dcp(base_step)
    as_adapter(step, base_step / P)
    return (f"{P}/adapter_config.json: its base policy {base_step / P} does not load: {base_step / P} holds only "
            f"DCP weight shards (pytorch_model_fsdp_0/), no model.safetensors; merge them first: lerobot convert-dcp "
            f"--checkpoint_dir={base_step}")


def as_dcp(step: Path) -> None:
    """The checkpoint as the ``dcp`` format saves it (shards only), with its manifest."""
    pretrained = step / P
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(load_file(pretrained / "model.safetensors"), checkpoint_id=str(pretrained / "pytorch_model_fsdp_0"))
    (pretrained / "model.safetensors").unlink()
    edit_json(step / T / "training_step.json", lambda d: {**d, "checkpoint_format": "dcp", "weights": "dcp"})
    write_manifest(step)


def last_into_another_run(step: Path, scratch: Path) -> str:
    other = scratch / "other"
    shutil.copytree(step.parents[1], other, symlinks=True)
    link = step.parent / "last"
    link.unlink()
    link.symlink_to(other / STEP)
    return f"{link} points to {other / STEP}, which is not a step folder of {step.parent}"


def state_file_outside(step: Path, scratch: Path) -> str:
    outside = scratch / "stats.safetensors"
    shutil.move(step / P / "policy_preprocessor_step_0_normalize.safetensors", outside)
    edit_json(step / P / "policy_preprocessor.json",
              lambda d: {**d, "steps": [{**d["steps"][0], "state_file": str(outside)}]})
    write_manifest(step)
    return f"{P}/policy_preprocessor.json: step 0: state_file '{outside}' is not the name of a .safetensors file in"


def shard_linked_outside(step: Path, scratch: Path) -> str:
    as_dcp(step)
    shard = next((step / P / "pytorch_model_fsdp_0").glob("*.distcp"))
    outside = scratch / shard.name
    shutil.move(shard, outside)
    shard.symlink_to(outside)
    write_manifest(step)  # one rewritten after the link records no shard at all: the link must be caught anyway
    return f"{P}/pytorch_model_fsdp_0/{shard.name}: links outside the shard folder (to {outside})"


def weights_linked_outside(step: Path, scratch: Path) -> str:
    weights = step / P / "model.safetensors"
    shutil.move(weights, scratch / "model.safetensors")
    weights.symlink_to(scratch / "model.safetensors")
    write_manifest(step)
    return f"{P}/model.safetensors: links outside the checkpoint (to {scratch / 'model.safetensors'})"


# --- running the commands -----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    damage: Callable[[Path, Path], str]
    loading_reads_it: bool  # --policy.path and eval read the file (pretrained_model/), not only the resume
    link: bool = False  # the damage is the run's last link, not a file of the step folder


def errors(stderr: str) -> list[str]:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def damaged(line: str) -> str:
    """How the resume calls a checkpoint with this problem: a file the layout table requires and
    the folder lacks makes it incomplete (``core.layout.files``), anything else damaged."""
    return "incomplete" if "training_state/training_step.json says" in line else "damaged"


def snapshot(run: Path) -> dict[str, str]:
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and "logs" not in p.parts}


def refused_alike(saved: Path, tmp_path: Path, case: Case, pools) -> None:
    """inspect names the problem (exit 1); the resume, and eval when loading reads the file, refuse
    with the same line (exit 1), writing nothing."""
    run = tmp_path / "run"
    shutil.copytree(saved, run, symlinks=True)
    step = run / STEP
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    said = case.damage(step, scratch)
    before = snapshot(run)

    inspected = run_cli("inspect-checkpoint", str(run if case.link else step))
    assert inspected.returncode == 1, inspected.stdout + inspected.stderr
    named = [line for line in errors(inspected.stderr) if line.startswith(f"error: {said}")]
    assert named, inspected.stderr
    line = named[0].removeprefix("error: ")
    whole = line if case.link else f"{step}/{line}"

    if case.link:
        resume = ["--resume=true", f"--output_dir={run}"]
    else:
        resume = ["--resume=true", f"--config_path={step / P / 'train_config.json'}"]
    resumed = pool_cli(pools, "train", *resume, "--steps=3", workdir=tmp_path)
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    [refused] = errors(resumed.stderr)
    assert refused.startswith(f"error: {whole}"), refused
    assert case.link or refused.endswith(f"; the checkpoint is {damaged(line)}: {resume_advice(step)}"), refused

    if case.loading_reads_it:
        evaluated = pool_cli(pools, "eval", f"--policy.path={run / 'checkpoints' / 'last'}", "--eval.n_episodes=1",
                             f"--output_dir={tmp_path / 'eval'}", workdir=tmp_path)
        assert evaluated.returncode == 1, evaluated.stderr[-3000:]
        [refused] = errors(evaluated.stderr)
        assert refused.startswith(f"error: {whole}"), refused
        assert case.link or refused.endswith(f"; the checkpoint is damaged: {LOAD_ADVICE}"), refused
        assert not (tmp_path / "eval").exists()
    assert snapshot(run) == before


CONTENTS = {
    "negative sampler offset in training_step.json": Case(negative_sampler_offset, loading_reads_it=False),
    "truncated RNG entry": Case(truncated_rng_entry, loading_reads_it=False),
    "non-numeric last_epoch in the scheduler state": Case(text_last_epoch, loading_reads_it=False),
    "processor JSON whose steps are not objects": Case(processor_steps_not_objects, loading_reads_it=True),
    "corrupt processor file without checksums": Case(corrupt_processor_state, loading_reads_it=True),
    "config.json that is a list": Case(config_that_is_a_list, loading_reads_it=True),
    "adapter_config.json with an unknown peft_type": Case(unknown_peft_type, loading_reads_it=True),
    "last link that loops": Case(looping_last, loading_reads_it=True, link=True),
}

VERDICTS = {
    "a parameter in two optimizer groups": Case(two_param_groups, loading_reads_it=False),
    "training_step.json whose step differs from its folder": Case(step_differs_from_folder, loading_reads_it=False),
    "optimizer state of a parameter the model lacks": Case(optimizer_state_of_a_renamed_parameter,
                                                           loading_reads_it=False),
    "model.safetensors that is a folder": Case(weights_file_that_is_a_folder, loading_reads_it=True),
    "PEFT base that is gone": Case(peft_base_gone, loading_reads_it=True),
    "PEFT base that holds only DCP shards": Case(peft_base_of_dcp_shards_only, loading_reads_it=True),
}

CONTAINMENT = {
    "last link into another run": Case(last_into_another_run, loading_reads_it=True, link=True),
    "processor state_file with an absolute path outside": Case(state_file_outside, loading_reads_it=True),
    "DCP shard linked to a file outside": Case(shard_linked_outside, loading_reads_it=False),
    "weights file linked outside": Case(weights_linked_outside, loading_reads_it=True),
}


@pytest.mark.parametrize("case", list(CONTENTS))
def test_damaged_contents_are_one_line_and_inspect_agrees_with_the_resume(saved, tmp_path, case, rank_pools):
    refused_alike(saved, tmp_path, CONTENTS[case], rank_pools)


@pytest.mark.parametrize("case", list(VERDICTS))
def test_inspect_calls_invalid_exactly_what_the_loaders_refuse(saved, tmp_path, case, rank_pools):
    refused_alike(saved, tmp_path, VERDICTS[case], rank_pools)


@pytest.mark.parametrize("case", list(CONTAINMENT))
def test_nothing_outside_the_run_is_read_through_a_checkpoint(saved, tmp_path, case, rank_pools):
    refused_alike(saved, tmp_path, CONTAINMENT[case], rank_pools)


def test_convert_dcp_refuses_a_shard_linked_outside(saved, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved, run, symlinks=True)
    said = shard_linked_outside(run / STEP, tmp_path)
    converted = run_cli("convert-dcp", f"--checkpoint_dir={run / STEP}", env=launch_env(tmp_path))
    assert converted.returncode == 1
    [line] = errors(converted.stderr)
    assert said.removeprefix(f"{P}/") in line, line
    assert not (run / STEP / P / "model.safetensors").exists()


def test_eval_of_a_policy_with_nan_actions_is_one_line_writes_nothing_and_a_rerun_is_free(saved, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(saved / STEP, broken)
    weights = broken / P / "model.safetensors"
    tensors = load_file(weights)
    tensors["action_head.bias"] = torch.full_like(tensors["action_head.bias"], float("nan"))
    save_file(tensors, weights, metadata={"format": "pt"})
    write_manifest(broken)  # saved so: only running the policy can tell

    out = tmp_path / "out"
    failed = run_cli("eval", f"--policy.path={broken}", "--eval.n_episodes=2", "--eval.max_episodes_rendered=1",
                     f"--output_dir={out}", env=launch_env(tmp_path))
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert errors(failed.stderr) == [
        "error: the policy's action at step 1 of episode 0 (seed 1000) is not finite (NaN or infinity), so no "
        "episode it drives means anything: its weights or normalisation stats hold NaN or infinity, or its "
        "computation overflows; evaluate an earlier step folder of the run"
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(("out", ".tmp"))]  # no folder, no half of one

    rerun = run_cli("eval", f"--policy.path={saved / STEP}", "--eval.n_episodes=2", "--eval.max_episodes_rendered=1",
                    f"--output_dir={out}", env=launch_env(tmp_path))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["eval_info.json", "rollouts.png", "videos"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
