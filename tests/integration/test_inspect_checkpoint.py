"""``inspect-checkpoint`` on real checkpoint files, through the installed console script.

The fixture writes the layout-1 tree the trainer writes, with real
safetensors files and real DCP folders from ``torch.distributed.checkpoint``; each test
then damages one thing and checks the exit code and the line naming the file.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from checkpoint_files import (
    STEP,
    optimizer_state,
    toy_model,
    trained,
    write_checkpoint,
    write_json,
)
from lerobot_kit.core.checkpoint.training_state import save_full_optimizer
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.manifest import write_manifest
from lerobot_kit.core.layout.dcp_metadata import TORCH_DTYPE_ITEMSIZE, UnsafeMetadataError, read_dcp_metadata
from lerobot_kit.core.offline.inspect import inspect_checkpoint
from lerobot_kit.core.errors import CheckpointError

pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
    pytest.mark.fast,  # offline, in process or the console script: the inner loop (-m "not slow") runs it
]

LEROBOT = Path(sys.executable).parent / "lerobot"


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    return subprocess.run(
        [str(LEROBOT), "inspect-checkpoint", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def run_json(path: Path) -> tuple[int, dict[str, Any]]:
    proc = run_cli(path, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def assert_fails_naming(step_dir: Path, *fragments: str) -> subprocess.CompletedProcess[str]:
    proc = run_cli(step_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert any(all(f in line for f in fragments) for line in errors), proc.stderr
    return proc


# --- valid checkpoints -----------------------------------------------------------------


def test_non_sharded_checkpoint_is_valid_and_listed(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path)
    proc = run_cli(step_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"step: {STEP}" in out and f"layout version: {L.LAYOUT_VERSION}" in out
    assert "topology: ddp, world_size=2 (dp_replicate=2, dp_shard=1)" in out
    assert "weights gathered, optimizer safetensors" in out and "PEFT: no" in out
    assert "pretrained_model/model.safetensors" in out and "0.weight  F32" in out and "[3, 4]" in out
    assert "4 tensors, 23 params, 92 bytes" in out  # 3x4 + 3 + 2x3 + 2
    assert "state.0.weight.exp_avg" in out
    assert "resumable: yes" in out and "loadable with --policy.path: yes" in out
    assert proc.stderr == ""

    code, report = run_json(step_dir)
    assert code == 0 and report["ok"] is True and report["problems"] == []
    assert report["step"] == STEP and report["weights"] == "gathered" and report["peft"] is False
    model = next(f for f in report["files"] if f["path"] == "pretrained_model/model.safetensors")
    assert model["count"] == 4 and model["params"] == 23 and model["bytes"] == 92
    assert {"name": "0.weight", "dtype": "F32", "shape": [3, 4], "bytes": 48} in model["tensors"]
    assert report["size_on_disk"] > sum(f["size"] for f in report["files"] if f["kind"] == "safetensors")
    assert report["resumable"]["ok"] and report["loadable"]["ok"]


@pytest.mark.parametrize("where", ["run", "checkpoints", "step", "pretrained_model", "training_state"])
def test_accepts_every_documented_path(tmp_path: Path, where: str) -> None:
    step_dir = write_checkpoint(tmp_path)
    path = {
        "run": tmp_path,
        "checkpoints": tmp_path / L.CHECKPOINTS_DIR,
        "step": step_dir,
        "pretrained_model": step_dir / L.PRETRAINED_DIR,
        "training_state": step_dir / L.TRAINING_STATE_DIR,
    }[where]
    report = inspect_checkpoint(path)
    assert report.ok, report.problems
    assert report.path.resolve() == step_dir.resolve()


@pytest.mark.parametrize("name", ["exported", L.PRETRAINED_DIR])
def test_a_policy_folder_on_its_own_is_checked_for_loading(tmp_path: Path, name: str) -> None:
    """What save_pretrained wrote outside a step folder (here a copied pretrained_model/):
    every file checked as --policy.path checks it; no training state, so not resumable,
    which is no problem."""
    step_dir = write_checkpoint(tmp_path / "run")
    folder = tmp_path / "models" / name
    shutil.copytree(step_dir / L.PRETRAINED_DIR, folder)
    proc = run_cli(folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"policy folder: {folder} (saved by save_pretrained, with no training state)")
    assert f"{name}/model.safetensors" in proc.stdout and "4 tensors, 23 params, 92 bytes" in proc.stdout
    assert "resumable: no (a policy folder holds no training state" in proc.stdout
    code, report = run_json(folder)
    assert code == 0 and report["kind"] == "policy_folder" and report["step"] is None
    assert report["weights"] == "gathered" and report["optimizer"] is None and report["checksums"]["state"] == "absent"
    weights = folder / L.MODEL_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-10])
    proc = assert_fails_naming(folder, f"{name}/model.safetensors: truncated")
    assert "loadable with --policy.path: no" in proc.stdout


def test_a_hub_snapshot_is_a_policy_folder_whose_links_stay_in_its_repo(tmp_path: Path) -> None:
    """The Hub's cache links a snapshot's files to ``../../blobs/<hash>``: those are read
    and their sizes counted; a link leaving the repo's cache folder is a problem."""
    exported = write_checkpoint(tmp_path / "run") / L.PRETRAINED_DIR
    repo = tmp_path / "hub" / "models--someone--toy"
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in exported.iterdir():
        shutil.copyfile(file, repo / "blobs" / file.name)
        (snapshot / file.name).symlink_to(Path("../../blobs") / file.name)
    code, report = run_json(snapshot)
    assert code == 0 and report["kind"] == "policy_folder", report["problems"]
    assert report["size_on_disk"] == sum(f.stat().st_size for f in exported.iterdir())
    (tmp_path / "elsewhere.json").write_text("{}")
    (snapshot / "notes.json").symlink_to(tmp_path / "elsewhere.json")
    assert_fails_naming(snapshot, f"{'c' * 40}/notes.json: links outside the checkpoint")


def test_dcp_only_checkpoint_is_resumable_but_needs_conversion_to_load(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, weights="dcp", optimizer="dcp", dp_shard=2)
    code, report = run_json(step_dir)
    assert code == 0, report["problems"]
    assert report["resumable"]["ok"] is True
    assert report["loadable"]["ok"] is False
    assert f"lerobot convert-dcp --checkpoint_dir={step_dir}" in report["loadable"]["why"]
    shards = next(f for f in report["files"] if f["path"] == "pretrained_model/pytorch_model_fsdp_0")
    assert shards["kind"] == "dcp" and shards["count"] == 4 and shards["params"] == 23
    assert {"name": "0.weight", "dtype": "float32", "shape": [3, 4], "bytes": 48, "chunks": 1} in shards["tensors"]
    text = run_cli(step_dir).stdout
    assert "pytorch_model_fsdp_0/" in text
    assert "loadable with --policy.path: no (the weights are DCP shards only" in text


def test_safetensors_dcp_and_peft_and_fp16_checkpoints_are_valid(tmp_path: Path) -> None:
    both = write_checkpoint(tmp_path / "both", weights="gathered+dcp", optimizer="dcp", dp_shard=2)
    peft = write_checkpoint(tmp_path / "peft", peft=True, mixed_precision="fp16")
    for step_dir in (both, peft):
        report = inspect_checkpoint(step_dir)
        assert report.ok, report.problems
        assert report.resumable.ok and report.loadable.ok
    assert inspect_checkpoint(peft).peft and "adapter" in inspect_checkpoint(peft).loadable.why


@pytest.mark.slow  # two processes save FSDP shards
def test_real_fsdp_shards_from_two_processes(tmp_path: Path) -> None:
    """Multi-chunk metadata as FSDP2 writes it (uneven and empty chunks included)."""
    script = textwrap.dedent(
        """
        import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        def save(rank, out):
            dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=2)
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
            fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
            opt = torch.optim.AdamW(model.parameters())
            model(torch.randn(5, 4)).sum().backward()
            opt.step()
            dcp.save(get_model_state_dict(model), checkpoint_id=out + "/pretrained_model/pytorch_model_fsdp_0")
            dcp.save(get_optimizer_state_dict(model, opt), checkpoint_id=out + "/training_state/optimizer_0")
            dist.barrier()
            dist.destroy_process_group()
            os._exit(0)  # skip interpreter teardown, where gloo threads can abort the process after the work is done

        if __name__ == "__main__":
            torch.multiprocessing.spawn(save, args=(sys.argv[1],), nprocs=2)
        """
    )
    step_dir = write_checkpoint(tmp_path, weights="dcp", optimizer="dcp", dp_shard=2)
    shutil.rmtree(step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR)
    shutil.rmtree(step_dir / L.TRAINING_STATE_DIR / L.DCP_OPTIMIZER_DIR)
    (step_dir / L.MANIFEST).unlink()  # its digests are of the shards replaced here
    (tmp_path / "fsdp_save.py").write_text(script)
    proc = subprocess.run(  # the timeout is the watchdog: a hung collective fails the test
        [sys.executable, str(tmp_path / "fsdp_save.py"), str(step_dir)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, report = run_json(step_dir)
    assert code == 0, report["problems"]
    shards = next(f for f in report["files"] if f["path"] == "pretrained_model/pytorch_model_fsdp_0")
    assert {"name": "0.weight", "dtype": "float32", "shape": [3, 4], "bytes": 48, "chunks": 2} in shards["tensors"]

    (step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR / "__1_0.distcp").unlink()
    assert_fails_naming(step_dir, "pretrained_model/pytorch_model_fsdp_0/__1_0.distcp: missing shard")


# --- damaged checkpoints -----------------------------------------------------------------


def test_truncated_safetensors_names_the_file(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, checksums=False)
    weights = step_dir / L.PRETRAINED_DIR / L.MODEL_WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    header_len = int.from_bytes(data[:8], "little")
    proc = assert_fails_naming(
        step_dir,
        f"pretrained_model/model.safetensors: truncated: header says 92 bytes of data, "
        f"file has {len(data) - 10 - 8 - header_len}",
    )
    assert "loadable with --policy.path: no" in proc.stdout and "resumable: no" in proc.stdout
    code, report = run_json(step_dir)
    assert code == 1 and report["ok"] is False and len(report["problems"]) == 1


def test_missing_and_short_dcp_shards(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, weights="dcp", optimizer="dcp", dp_shard=2)
    shard = step_dir / L.TRAINING_STATE_DIR / L.DCP_OPTIMIZER_DIR / "__0_0.distcp"
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size - 100)
    assert_fails_naming(
        step_dir,
        "training_state/optimizer_0/__0_0.distcp: truncated shard",
        f"needs {size} bytes",
        f"file has {size - 100}",
    )
    (step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR / "__0_0.distcp").unlink()
    assert_fails_naming(step_dir, "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp: missing shard")
    (step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR / L.DCP_METADATA).unlink()
    assert_fails_naming(step_dir, "pretrained_model/pytorch_model_fsdp_0: .metadata is missing")


@pytest.mark.parametrize(
    "rel", ["pretrained_model/config.json", "training_state/training_step.json", "pretrained_model/dataset_meta.json"]
)
def test_json_that_does_not_parse(tmp_path: Path, rel: str) -> None:
    step_dir = write_checkpoint(tmp_path)
    (step_dir / rel).write_text('{"type": "act",')
    assert_fails_naming(step_dir, f"{rel}: not valid JSON (Expecting")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": "500"}, "training_state/training_step.json: step must be an integer, not a string"),
        ({"peft": 0}, "peft must be true or false, not an integer"),
        ({"weights": "sharded"}, "weights is 'sharded', expected one of gathered, dcp, gathered+dcp"),
        ({"sampler": {"epoch": 3}}, "missing key 'sampler.offset'"),
        ({"step": 400}, "step is 400, but the folder is 000500"),
        ({"dp_world_size": 4}, "dp_world_size is 4, but topology has dp_replicate × dp_shard = 2 × 1 = 2"),
    ],
)
def test_training_step_schema(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    step_dir = write_checkpoint(tmp_path)
    path = step_dir / L.TRAINING_STATE_DIR / L.TRAINING_STEP
    write_json(path, {**json.loads(path.read_text()), **change})
    assert_fails_naming(step_dir, message)


def test_missing_files_and_bad_config(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, mixed_precision="fp16")
    (step_dir / L.TRAINING_STATE_DIR / L.SCALER_STATE).unlink()
    (step_dir / L.PRETRAINED_DIR / f"{L.PREPROCESSOR}_step_0_normalize.safetensors").unlink()
    write_json(step_dir / L.PRETRAINED_DIR / L.POLICY_CONFIG, {"dim_model": 8})
    report = inspect_checkpoint(step_dir)
    assert not report.ok and not report.loadable.ok
    assert (
        "training_state/scaler_state.json: missing (training_state/training_step.json says mixed_precision: fp16)"
    ) in report.problems
    assert (
        "pretrained_model/policy_preprocessor.json: step 0: refers to "
        "policy_preprocessor_step_0_normalize.safetensors, which is missing"
    ) in report.problems
    assert 'pretrained_model/config.json: must be a JSON object with a "type" string' in report.problems

    shutil.rmtree(step_dir / L.TRAINING_STATE_DIR)
    report = inspect_checkpoint(step_dir)
    assert report.problems[-1] == "training_state/: missing"


def test_optimizer_state_of_anothertoy_model(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path)
    other = toy_model(hidden=5)
    save_full_optimizer(optimizer_state(other, trained(other)), step_dir / L.TRAINING_STATE_DIR)
    assert_fails_naming(
        step_dir,
        "training_state/optimizer_state.safetensors: state of parameter 0.bias has shape [5], "
        "but pretrained_model/model.safetensors has it as [3]",
    )


def test_optimizer_state_by_index_is_checked_by_shape(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, optimizer_keys="index")
    assert inspect_checkpoint(step_dir).ok
    other = toy_model(hidden=5)
    state_dir = step_dir / L.TRAINING_STATE_DIR
    save_full_optimizer(optimizer_state(other, trained(other), "index"), state_dir)
    assert_fails_naming(step_dir, "state of parameter 0 has shape [5, 4], which no (remaining) tensor of")

    save_full_optimizer(optimizer_state(toy_model(), trained(toy_model()), "index"), state_dir)
    groups = state_dir / L.OPTIMIZER_PARAM_GROUPS
    write_json(groups, [{**json.loads(groups.read_text())[0], "params": [0, 1, 2]}])
    assert_fails_naming(
        step_dir,
        "holds state for parameter 3, which no param group of training_state/optimizer_param_groups.json lists",
    )
    write_json(groups, [{**json.loads(groups.read_text())[0], "params": list(range(6))}])
    assert_fails_naming(
        step_dir,
        "optimizer_param_groups.json: lists 6 parameters, but pretrained_model/model.safetensors holds only 4 entries",
    )


def test_optimizer_state_for_a_parameter_no_group_lists(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path)
    groups = step_dir / L.TRAINING_STATE_DIR / L.OPTIMIZER_PARAM_GROUPS
    group = json.loads(groups.read_text())[0]
    write_json(groups, [{**group, "params": group["params"][:-1]}])
    assert_fails_naming(step_dir, "holds state for parameter 2.bias, which no param group")


def test_dcp_optimizer_of_anothertoy_model(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, weights="dcp", optimizer="dcp", dp_shard=2)
    other = toy_model(hidden=5)
    target = step_dir / L.TRAINING_STATE_DIR / L.DCP_OPTIMIZER_DIR
    shutil.rmtree(target)
    dcp.save(optimizer_state(other, trained(other)), checkpoint_id=target, no_dist=True)
    assert_fails_naming(
        step_dir,
        "training_state/optimizer_0: state of parameter 0.bias has shape [5], "
        "but pretrained_model/pytorch_model_fsdp_0 has it as [3]",
    )


def test_old_layout_gathered_optimizer_in_sharded_run(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, dp_shard=2)  # gathered weights and optimizer, as LeRobot 0.6 wrote
    proc = assert_fails_naming(
        step_dir,
        "training_state/optimizer_state.safetensors: old layout: a sharded run (dp_shard=2)",
        "cannot be resumed",
        f"loading the weights still works: --policy.path={step_dir / L.PRETRAINED_DIR}",
    )
    assert "loadable with --policy.path: yes" in proc.stdout and "resumable: no (" in proc.stdout
    code, report = run_json(step_dir)
    assert code == 1 and report["loadable"]["ok"] is True and report["resumable"]["ok"] is False
    assert len(report["problems"]) == 1


@pytest.mark.parametrize(("version", "word"), [(99, "a newer, unknown layout"), (0, "an older layout")])
def test_other_layout_versions(tmp_path: Path, version: int, word: str) -> None:
    step_dir = write_checkpoint(tmp_path)
    path = step_dir / L.TRAINING_STATE_DIR / L.TRAINING_STEP
    write_json(path, {**json.loads(path.read_text()), "layout_version": version})
    assert_fails_naming(
        step_dir, f"layout version {version} is {word}", "cannot be resumed", "loading the weights still works"
    )


def test_lerobot_06_training_step_without_layout_version(tmp_path: Path) -> None:
    """LeRobot's step folder: its training state is LeRobot's (its RNG entries are not this
    layout's), so the one problem is that it cannot be resumed; its weights still load."""
    step_dir = write_checkpoint(tmp_path)
    write_json(step_dir / L.TRAINING_STATE_DIR / L.TRAINING_STEP, {"step": STEP})
    save_file({"np_rng_has_gauss": torch.zeros(1), "torch_rng_state": torch.zeros(8, dtype=torch.uint8)},
              step_dir / L.TRAINING_STATE_DIR / L.RNG_STATE)
    write_manifest(step_dir)
    report = inspect_checkpoint(step_dir)
    assert report.loadable.ok and not report.resumable.ok
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith("training_state/training_step.json: has no layout_version: an older layout")


# --- malicious DCP metadata --------------------------------------------------------------


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_metadata_is_refused_and_not_run(tmp_path: Path) -> None:
    step_dir = write_checkpoint(tmp_path, weights="dcp", optimizer="dcp", dp_shard=2)
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(marker))
    pickle.loads(evil)  # the payload is live: plain pickle runs it
    assert marker.exists()
    marker.unlink()

    shards = step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR
    (shards / L.DCP_METADATA).write_bytes(evil)
    with pytest.raises(UnsafeMetadataError, match=r"refusing to load posix\.system from \.metadata"):
        read_dcp_metadata(shards)
    proc = assert_fails_naming(
        step_dir,
        "pretrained_model/pytorch_model_fsdp_0: refusing to load posix.system from .metadata: "
        "not a checkpoint-metadata class",
    )
    assert "resumable: no" in proc.stdout
    assert not marker.exists()


def test_metadata_hiding_a_call_inside_real_metadata_is_refused(tmp_path: Path) -> None:
    """A real .metadata with one value swapped for a payload: refused wherever it sits."""
    step_dir = write_checkpoint(tmp_path, weights="dcp", optimizer="dcp", dp_shard=2)
    marker = tmp_path / "pwned"
    import torch.distributed.checkpoint.metadata as meta  # the real classes, to build a real-looking file

    shards = step_dir / L.PRETRAINED_DIR / L.DCP_MODEL_DIR
    with (shards / L.DCP_METADATA).open("rb") as f:
        real = pickle.load(f)
    assert isinstance(real, meta.Metadata)
    real.version = _Payload(marker)
    (shards / L.DCP_METADATA).write_bytes(pickle.dumps(real))
    assert_fails_naming(step_dir, "refusing to load posix.system from .metadata")
    assert not marker.exists()


def test_garbage_metadata(tmp_path: Path) -> None:
    shards = write_checkpoint(tmp_path, weights="dcp", optimizer="dcp", dp_shard=2) / L.PRETRAINED_DIR / L.DCP_MODEL_DIR
    meta = shards / L.DCP_METADATA
    meta.write_bytes(meta.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable DCP metadata file"):
        read_dcp_metadata(shards)
    meta.write_bytes(pickle.dumps({"state_dict_metadata": {}}))
    with pytest.raises(CheckpointError, match="holds a dict, not DCP Metadata"):
        read_dcp_metadata(shards)


def test_metadata_cannot_change_the_shared_dtype_stand_ins(tmp_path: Path) -> None:
    """BUILD on an admitted global (here torch.float32) must fail, not rewrite it for later reads."""

    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode()

    evil = b"\x80\x04" + text("torch") + text("float32") + b"\x93}" + text("itemsize") + b"K\x63sb."
    (tmp_path / L.DCP_METADATA).write_bytes(evil)
    with pytest.raises(CheckpointError, match="not a readable DCP metadata file"):
        read_dcp_metadata(tmp_path)
    assert TORCH_DTYPE_ITEMSIZE["float32"] == 4
    step_dir = write_checkpoint(tmp_path / "run", weights="dcp", optimizer="dcp", dp_shard=2)
    model = next(f for f in inspect_checkpoint(step_dir).files if f.path.endswith(L.DCP_MODEL_DIR))
    assert model.tensors is not None and {t.nbytes for t in model.tensors} == {48, 12, 24, 8}
    assert {t.dtype for t in model.tensors} == {"float32"}


# --- usage and torch-free ----------------------------------------------------------------


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    proc = run_cli(tmp_path / "nope")
    assert proc.returncode == 2 and "no such checkpoint folder" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli(tmp_path)
    assert proc.returncode == 2 and "not a checkpoint" in proc.stderr
    proc = run_cli(tmp_path, "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["ok"] is False
    assert run_cli().returncode == 2  # no PATH


def test_help_documents_exit_codes() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "Exit codes:" in proc.stdout and "0  the checkpoint is valid" in proc.stdout
    assert "2  usage error" in proc.stdout and "--json" in proc.stdout


def test_does_not_import_torch(tmp_path: Path) -> None:
    ok = write_checkpoint(tmp_path / "ok", weights="gathered+dcp", optimizer="dcp", dp_shard=2)
    bad = write_checkpoint(tmp_path / "bad", weights="dcp", optimizer="dcp", dp_shard=2)
    (bad / L.PRETRAINED_DIR / L.DCP_MODEL_DIR / "__0_0.distcp").unlink()
    code = textwrap.dedent(
        f"""
        import sys
        from click.testing import CliRunner
        from lerobot_kit.cli.main import cli
        runner = CliRunner()
        ok = runner.invoke(cli, ["inspect-checkpoint", {str(ok)!r}])
        bad = runner.invoke(cli, ["inspect-checkpoint", {str(bad)!r}, "--json"])
        assert (ok.exit_code, bad.exit_code) == (0, 1), (ok.output, bad.output)
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        print("torch-free")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "torch-free" in proc.stdout, proc.stderr
