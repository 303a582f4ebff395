"""Flags and config files a command cannot use, through the console scripts: one ``error:``
line per problem naming the flag or file (never a traceback, never a library's URL), the
documented exit code, and nothing written. Numbers outside what the run can use (past
int64, negative seeds, NaN) and pathological JSON (nested 100000 deep, 2 GB, /dev/zero, a
pipe, a directory, a list, 1e999) are refused while the flags are parsed, before any model
is built; a checkpoint's ``config.json`` that its policy rejects is one ``CheckpointError``
line; a resume with nothing left to train says so in one line and exits 0."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_cli

from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.manifest import write_manifest

pytestmark = pytest.mark.fast  # starts no training run: the inner loop (-m "not slow") runs it

HUGE = "99999999999999999999999"  # past int64
DEEP = 60_000  # nesting of a flag value (one argument may hold 128 KiB)
TINY = ["--policy.dim_model=16", "--policy.dim_feedforward=32", "--policy.n_encoder_layers=1",
        "--policy.n_decoder_layers=1", "--policy.n_vae_encoder_layers=1", "--batch_size=2", "--num_workers=0",
        "--dataset.num_episodes=2", "--dataset.episode_length=10"]


def _file(name: str, content: str | bytes) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        path = folder / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)
    return make


def _sparse_2gb(folder: Path) -> str:
    path = folder / "huge.json"
    with path.open("wb") as file:
        file.truncate(2 * 2**30)  # no disk used: a hole that reads as NUL bytes
    return str(path)


def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "pipe.json")  # opened for reading, it would block until a writer comes
    return str(folder / "pipe.json")


def _directory(folder: Path) -> str:
    (folder / "configs").mkdir()
    return str(folder / "configs")


CONFIG_FILES = {
    "nested 100000 deep": (_file("deep.json", "[" * 100_000 + "]" * 100_000), "nested more than 64 levels deep"),
    "nested 100 deep": (_file("deep.json", '{"policy": ' + "[" * 100 + "]" * 100 + "}"),
                        "nested more than 64 levels deep"),
    "2 GB": (_sparse_2gb, "is larger than 16 MiB, which no config is"),
    "/dev/zero": (lambda folder: "/dev/zero", "a character device, not a file"),
    "a named pipe": (_fifo, "a named pipe, not a file"),
    "a directory": (_directory, "a folder, not a file"),
    "not UTF-8": (_file("latin.json", b'{"job_name": "caf\xe9"}'),
                  "not UTF-8 text (byte 0xe9 at offset 17); save it as UTF-8 JSON"),
    "a list": (_file("list.json", "[1, 2]"), "expected a JSON object at the top level, got a list"),
    "1e999": (_file("inf.json", '{"optimizer": {"lr": 1e999}}'), "the number 1e999 is beyond a float's range"),
    "NaN": (_file("nan.json", '{"optimizer": {"lr": NaN}}'), "NaN is not a JSON number; give a finite number"),
    "5000 digits": (_file("digits.json", '{"steps": ' + "9" * 5000 + "}"),
                    "the integer 999999999999... has 5000 digits, beyond any field's range"),
    "LeRobot's run config": (_file("train_config.json", json.dumps(
        {"dataset": {"repo_id": "user/data"}, "policy": {"type": "act", "device": "cuda"}, "wandb": {"enable": False},
         "use_policy_training_preset": True, "prefetch_factor": 4})),
        "a train_config.json that LeRobot's lerobot-train wrote: lerobot-kit neither reads LeRobot's settings nor "
        "resumes LeRobot's runs (its training state is LeRobot's layout); start from its weights with "
        "--policy.path=<its pretrained_model/> and give the settings as flags"),
}


@pytest.mark.parametrize("make, expected", CONFIG_FILES.values(), ids=CONFIG_FILES.keys())
def test_a_config_file_that_cannot_be_a_config_is_one_line(tmp_path: Path, make, expected: str) -> None:
    path = make(tmp_path)
    line = refused(tmp_path, "train", f"--config_path={path}")
    assert line.startswith(f"error: --config_path={path}: {expected}"), line


# (command, flags, the line's start after "error: "): all refused before a model is built.
FLAGS = {
    "steps past int64": ("train", [f"--steps={HUGE}"],
                         f"--steps: Value error, {HUGE} is beyond the range of a 64-bit integer"),
    "steps of 5000 digits": ("train", ["--steps=" + "9" * 5000],
                             "--steps: Unable to parse input string as an integer, exceeded maximum size (got '999"),
    "a policy size past int64": ("train", [f"--policy.chunk_size={HUGE}"], "--policy.chunk_size: Value error, "),
    "negative seed": ("train", ["--seed=-1"], "--seed: Input should be greater than or equal to 0"),
    "seed past numpy's": ("train", ["--seed=4294967296"], "--seed: Input should be less than 4294967296"),
    "negative data seed": ("train", ["--dataset.generation_seed=-1"], "--dataset.generation_seed: Input should be"),
    "workers without end": ("train", [f"--num_workers={HUGE}"], "--num_workers: Input should be less than or equal"),
    "timeout past timedelta": ("train", [f"--parallelism.timeout_s={HUGE}"], "--parallelism.timeout_s: Input should"),
    "a NaN weight": ("train", ["--policy.kl_weight=nan"], "--policy.kl_weight: Input should be a finite number"),
    "an infinite transform weight": ("train", ["--dataset.image_transforms.tfs.hue.weight=inf"],
                                     "--dataset.image_transforms.tfs.hue.weight: Input should be a finite number"),
    "a JSON flag nested 60000 deep": ("train", ["--policy.x=" + "[" * DEEP + "]" * DEEP],
                                      "--policy.x: the value looks like JSON but is unusable: nested more than 64"),
    "a JSON flag with 1e999": ("train", ["--accelerator.fsdp.wrap_modules=[1e999]"],
                               ("--accelerator.fsdp.wrap_modules: the value looks like JSON but is unusable: the "
                                "number 1e999 is beyond a float's range")),
    "a JSON flag with NaN": ("train", ["--optimizer.betas=[NaN, 0.9]"], "--optimizer.betas: the value looks like"),
    "an integer past int64 inside a JSON flag": (
        "train", ['--dataset.image_transforms.tfs.hue.kwargs={"hue": ' + HUGE + "}"],
        f"--dataset.image_transforms.tfs.hue.kwargs: Value error, {HUGE} is beyond the range of a 64-bit integer"),
    "eval: negative seed": ("eval", ["--policy.path=x", "--seed=-1"], "--seed: Input should be greater than or"),
    "eval: episodes held in memory": ("eval", ["--policy.path=x", "--eval.n_episodes=1000000000000"],
                                      "--eval.n_episodes: Input should be less than or equal to 1000000"),
    "eval: batch past int64": ("eval", ["--policy.path=x", f"--eval.batch_size={HUGE}"], "--eval.batch_size: Value"),
    "plan: world past int32": ("plan", ["--world_size=" + HUGE], f"--world_size={HUGE}: expected a positive number"),
    "plan: a digit that is not ASCII": ("plan", ["--world_size=²"], "--world_size=²: expected a positive number"),
    "plan: memory past 1 PiB": ("plan", ["--world_size=1", "--plan.device_memory_gb=1e300"],
                                "--plan.device_memory_gb=1e300: expected a positive number of GiB per rank, at most"),
    "plan: a train flag past int64": ("plan", ["--world_size=1", f"--batch_size={HUGE}"], "--batch_size: Value error"),
    "convert-dcp: not a boolean": ("convert-dcp", ["--checkpoint_dir=x", "--delete_dcp=maybe"],
                                   "Invalid value for '--delete_dcp': 'maybe' is not a valid boolean."),
    "convert-dcp: a missing flag": ("convert-dcp", [], ("Missing option '--checkpoint_dir'. (`lerobot convert-dcp "
                                                        "--help` lists the flags)")),
    "inspect-checkpoint: an unknown flag": ("inspect-checkpoint", ["--bogus", "x"], "No such option '--bogus'."),
    "LeRobot's device flag": ("train", ["--policy.device=cuda"], (
        "--policy.device: a LeRobot flag that lerobot-kit does not take: each rank runs on its launcher's device")),
    "LeRobot's wandb flags": ("train", ["--wandb.enable=true", "--wandb.project=p"], (
        "--wandb: a LeRobot flag that lerobot-kit does not take: lerobot-kit logs to trackio (--trackio.enable=true")),
    "eval: LeRobot's amp flag": ("eval", ["--policy.path=x", "--policy.use_amp=true"], (
        "--policy.use_amp: a LeRobot flag that lerobot-kit does not take: use --accelerator.mixed_precision=bf16")),
}


@pytest.mark.parametrize("command, flags, expected", FLAGS.values(), ids=FLAGS.keys())
def test_a_flag_outside_its_range_is_one_line(tmp_path: Path, command: str, flags: list[str], expected: str) -> None:
    line = refused(tmp_path, command, *flags)
    assert line.startswith(f"error: {expected}"), line
    assert len(line) < 400, line  # a 5000-digit or 120 KB value is not echoed whole


def refused(cwd: Path, command: str, *args: str, code: int = 2) -> str:
    """The one stderr line of ``lerobot <command> <args>`` run in ``cwd``, which must exit
    ``code`` without writing anything there (the default output folder is under ``cwd``)."""
    before = sorted(cwd.rglob("*"))
    result = run_cli(command, *args, cwd=cwd, timeout=60)  # a read of /dev/zero or a pipe would hang: fails here
    assert result.returncode == code, result.stdout + result.stderr[-3000:]
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "pydantic.dev" not in result.stderr
    assert sorted(cwd.rglob("*")) == before
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ACT run of two steps, its checkpoint at step 2."""
    run = tmp_path_factory.mktemp("trained") / "run"
    result = run_cli("train", *TINY, "--steps=2", f"--output_dir={run}", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def _damaged_policy_config(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the trained checkpoint whose config.json act rejects in three fields, with
    checksums that agree (a checkpoint of another version, or edited by hand and re-summed):
    only the config is wrong. Returns (step folder, config.json)."""
    step_dir = tmp_path / "000002"
    shutil.copytree(trained / L.CHECKPOINTS_DIR / "000002", step_dir)
    config_json = step_dir / L.PRETRAINED_DIR / L.POLICY_CONFIG
    config = json.loads(config_json.read_text())
    config.update(dim_model="wide", n_heads=-1, from_the_future=True)
    config_json.write_text(json.dumps(config))
    write_manifest(step_dir)
    return step_dir, config_json


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_checkpoint_config_its_policy_rejects_is_one_line_with_the_count(
    trained: Path, tmp_path: Path, command: str
) -> None:
    step_dir, config_json = _damaged_policy_config(trained, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    extra = ["--eval.n_episodes=1"] if command == "eval" else [*TINY[-4:], "--steps=1"]
    line = refused(work, command, f"--policy.path={step_dir}", *extra, code=1)
    # The line of the one check every reader shares (inspect-checkpoint names the same problem).
    assert line.startswith(f"error: {config_json}: not a valid 'act' config: "), line
    assert line.endswith("(and 2 more); the checkpoint is damaged: load an earlier step folder of the run"), line


@pytest.mark.parametrize("command", ["train", "eval", "inspect-checkpoint"])
def test_a_config_lerobot_wrote_asks_for_the_bridge_when_it_is_not_installed(
    trained: Path, tmp_path: Path, command: str
) -> None:
    """A folder lerobot-train wrote names type "act" with LeRobot's fields: without the
    bridge (not installed here) it is not damaged, and the line says what to install."""
    folder = tmp_path / "from_lerobot"
    shutil.copytree(trained / L.CHECKPOINTS_DIR / "000002" / L.PRETRAINED_DIR, folder)
    config = json.loads((folder / L.POLICY_CONFIG).read_text())
    features = {"observation.state": {"type": "STATE", "shape": [3]}}
    config.update(input_features=features, output_features={"action": {"type": "ACTION", "shape": [3]}})
    (folder / L.POLICY_CONFIG).write_text(json.dumps(config))
    work = tmp_path / "work"
    work.mkdir()
    if command == "inspect-checkpoint":  # the report on stdout, the problem on stderr
        result = run_cli(command, str(folder), cwd=work, timeout=60)
        assert result.returncode == 1, result.stdout + result.stderr
        [line] = result.stderr.splitlines()
    else:
        line = refused(work, command, f"--policy.path={folder}", *(["--steps=1"] if command == "train" else []), code=1)
    assert "not a valid 'act' config: " in line and line.endswith(
        "LeRobot wrote it (it records input_features and output_features): install the LeRobot bridge "
        "(lerobot-kit-lerobot, in contrib/ of lerobot-kit's source; Python >= 3.12) to read it as "
        "--policy.type=lerobot_act"), line


def test_a_flag_over_a_valid_checkpoint_config_stays_a_flag_error(trained: Path, tmp_path: Path) -> None:
    """Only what the file holds is the checkpoint's fault: a bad flag over it is the user's (exit 2)."""
    step_dir = trained / L.CHECKPOINTS_DIR / "000002"
    line = refused(tmp_path, "train", f"--policy.path={step_dir}", "--policy.n_heads=-3")
    assert line.startswith("error: --policy.n_heads: Input should be greater than or equal to 1 (got '-3')"), line


def test_inspect_names_the_first_problem_of_a_rejected_config_and_counts_the_rest(
    trained: Path, tmp_path: Path
) -> None:
    step_dir, _ = _damaged_policy_config(trained, tmp_path)
    result = run_cli("inspect-checkpoint", str(step_dir), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "error: pretrained_model/config.json: not a valid 'act' config: dim_model: Input should be a valid integer, "
        "unable to parse string as an integer (got 'wide') (and 2 more)"]


@pytest.mark.parametrize("resume, steps", [("auto", 2), ("true", 1)], ids=["auto, finished", "true, fewer steps"])
def test_a_resume_with_nothing_left_to_train_says_so_in_one_line_and_exits_0(
    trained: Path, tmp_path: Path, resume: str, steps: int
) -> None:
    """A scheduler rerunning a finished job must see it succeed (or it reruns it forever);
    nothing is trained, written or removed, and the line says which --steps continues it."""
    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    before = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    result = run_cli("train", *TINY, f"--steps={steps}", f"--output_dir={run}", f"--resume={resume}", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    step_dir = run / L.CHECKPOINTS_DIR / "000002"
    [line] = result.stderr.splitlines()
    assert line.endswith(
        f" warning: nothing left to train: {step_dir} is step 2 and --steps={steps}, so no step was run and nothing "
        "was written; to train on from it, pass --steps greater than 2 (the total number of steps, not the steps to "
        "add)"), line
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*")} == before
