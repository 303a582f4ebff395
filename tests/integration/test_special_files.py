"""Checkpoint files that cannot be read, and what every command says about them, through the console script.

One tiny run (steps 2 and 4 saved, the last with DCP weight shards beside its
``model.safetensors``) is built once; each case copies it and changes one thing:

- a named pipe in place of a file (``training_step.json``, ``model.safetensors``, the
  shards' ``.metadata``, ``policy_preprocessor.json``): every command refuses it, unopened,
  in one line and within seconds, where opening it would wait forever for a writer;
- a file or folder this user may not read (a child that runs as root without the
  capabilities that let root ignore permissions): named with its errno and the fix, never
  as damage, and the resume deletes nothing; only real damage gets the advice to resume
  an earlier step, naming the step folders that would delete;
- a ``config.json`` its policy rejects, without ``checksums.json``: inspect's verdict and
  line are what the resume, ``eval`` and ``train --policy.path`` decide and say;
- evaluation folders: ``lerobot eval --output_dir`` inside a training run is refused, and an
  evaluation during training never replaces an earlier one of the same step.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from _dist_util import clean_env
from conftest import TINY_ACT, built_once, script
from lerobot_kit.core.layout import paths as L
from lerobot_kit.core.layout.files import resume_advice
from lerobot_kit.core.layout.manifest import MANIFEST, write_manifest

pytestmark = pytest.mark.fast  # refusals before anything is built; the one run is built once per session

P, T = L.PRETRAINED_DIR, L.TRAINING_STATE_DIR
SMALL = [*TINY_ACT, "--dataset.num_episodes=2", "--dataset.episode_length=20", "--batch_size=8"]
HANG = 10  # seconds: a refusal comes in one or two; a command that opened a named pipe would never return
LOAD_ADVICE = "load an earlier step folder of the run"
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder: steps 2 and 4, step 4 holding gathered weights and DCP shards."""
    def build(root: Path) -> None:
        run = root / "run"
        done = lerobot("train", *SMALL, "--steps=4", "--save_freq=2", f"--output_dir={run}", cwd=root, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        step = run / L.CHECKPOINTS_DIR / "000004"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process saves alone
            dcp.save(load_file(step / P / L.MODEL_WEIGHTS), checkpoint_id=str(step / P / L.DCP_MODEL_DIR))
        record = step / T / L.TRAINING_STEP
        record.write_text(json.dumps({**json.loads(record.read_text()), "weights": "gathered+dcp"}))
        write_manifest(step)

    return built_once(tmp_path_factory, "special_files", build) / "run"


def lerobot(*args: str, cwd: Path, timeout: float = HANG,
            unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    """The installed console script; ``unprivileged``: as root without the capabilities that make
    root ignore file permissions, so that a file mode denies it as it denies any user."""
    return subprocess.run([script("lerobot"), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=clean_env(cwd), preexec_fn=_drop_file_capabilities if unprivileged else None)


def _drop_file_capabilities() -> None:
    if os.geteuid() != 0:
        return  # an ordinary user: the file mode applies already
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def one_line(result: subprocess.CompletedProcess[str], codes: tuple[int, ...] = (1,)) -> str:
    assert result.returncode in codes, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if not line[:2].isdigit()]  # log lines start with a time
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    return lines[0].removeprefix("error: ")


def copy_run(saved: Path, tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    shutil.copytree(saved, run, symlinks=True)
    return run, run / L.CHECKPOINTS_DIR / "000004"


def files_of(run: Path) -> dict[str, int]:
    """Every entry of the run and its size, to tell that nothing was written or removed."""
    return {p.relative_to(run).as_posix(): p.lstat().st_size for p in sorted(run.rglob("*")) if "logs" not in p.parts}


# --- named pipes ----------------------------------------------------------------------------

PIPES = {
    "training_step.json": f"{T}/{L.TRAINING_STEP}",
    "model.safetensors": f"{P}/{L.MODEL_WEIGHTS}",
    "DCP .metadata": f"{P}/{L.DCP_MODEL_DIR}/{L.DCP_METADATA}",
    "policy_preprocessor.json": f"{P}/{L.PREPROCESSOR}.json",
}

COMMANDS = {
    "inspect-checkpoint": lambda step, work: ["inspect-checkpoint", str(step)],
    "eval": lambda step, work: ["eval", f"--policy.path={step}", "--eval.n_episodes=1", f"--output_dir={work / 'ev'}"],
    "convert-dcp": lambda step, work: ["convert-dcp", f"--checkpoint_dir={step}"],
    "train --policy.path": lambda step, work: ["train", *SMALL, f"--policy.path={step}", "--steps=1",
                                               f"--output_dir={work / 'new'}"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("pipe", list(PIPES))
def test_a_named_pipe_in_a_checkpoint_is_refused_unopened(saved: Path, tmp_path: Path, pipe: str, command: str):
    run, step = copy_run(saved, tmp_path)
    rel = PIPES[pipe]
    (step / rel).unlink()
    os.mkfifo(step / rel)  # opened for reading, it blocks until a writer comes: forever
    before = files_of(run)
    started = time.monotonic()
    line = one_line(lerobot(*COMMANDS[command](step, tmp_path), cwd=tmp_path))
    assert time.monotonic() - started < HANG
    assert f"{rel}: a named pipe, not a file" in line, line
    assert files_of(run) == before and not (tmp_path / "ev").exists() and not (tmp_path / "new").exists()


@pytest.mark.parametrize("pipe", list(PIPES))
def test_the_resume_refuses_the_same_named_pipes(saved: Path, tmp_path: Path, pipe: str):
    """The resume's refusal comes after torch is imported: a longer watchdog, the same promise."""
    run, step = copy_run(saved, tmp_path)
    rel = PIPES[pipe]
    (step / rel).unlink()
    os.mkfifo(step / rel)
    line = one_line(lerobot("train", "--resume=true", f"--config_path={step / P / L.TRAIN_CONFIG}", "--steps=6",
                            cwd=tmp_path, timeout=120))
    assert line.startswith(f"{step}/{rel}: a named pipe, not a file"), line
    assert line.endswith(resume_advice(step)), line


# --- permissions: named as such, never as damage ------------------------------------------------


@pytest.mark.parametrize("unreadable", [f"{P}/{L.MODEL_WEIGHTS}", f"{T}/{L.TRAINING_STEP}", T])
def test_a_file_this_user_may_not_read_is_named_with_its_errno_and_fix(saved: Path, tmp_path: Path, unreadable: str):
    run, step = copy_run(saved, tmp_path)
    (step / unreadable).chmod(0)
    before = files_of(run)
    commands = {
        "inspect-checkpoint": ["inspect-checkpoint", str(step)],
        "resume": ["train", "--resume=true", f"--output_dir={run}", "--steps=6"],
        "eval": COMMANDS["eval"](step, tmp_path),
        "train --policy.path": COMMANDS["train --policy.path"](step, tmp_path),
        "convert-dcp": COMMANDS["convert-dcp"](step, tmp_path),
    }
    for name, args in commands.items():
        if name in ("eval", "train --policy.path", "convert-dcp") and unreadable == T:
            continue  # loading reads no more of training_state/ than its record, the case before
        line = one_line(lerobot(*args, cwd=tmp_path, timeout=120 if name == "resume" else HANG, unprivileged=True))
        assert "cannot be" in line and "Permission denied (errno EACCES)" in line, (name, line)
        assert "fix the permissions or the ownership (chmod, chown)" in line, (name, line)
        assert "nothing needs deleting" in line, (name, line)
        assert "damaged" not in line and "--resume_from" not in line, (name, line)
    (step / unreadable).chmod(0o755 if unreadable == T else 0o644)
    assert files_of(run) == before  # the resume deleted nothing, and nothing was written


def test_only_real_damage_gets_the_advice_that_deletes_step_folders_and_it_names_them(saved: Path, tmp_path: Path):
    run, step = copy_run(saved, tmp_path)
    scheduler = step / T / L.SCHEDULER_STATE
    scheduler.write_text(json.dumps({**json.loads(scheduler.read_text()), "last_epoch": "four"}))
    (step / MANIFEST).unlink()  # as a checkpoint saved before checksums: the check of the contents speaks
    line = one_line(lerobot("train", "--resume=true", f"--output_dir={run}", "--steps=6", cwd=tmp_path, timeout=120))
    assert line == (
        f"{step}/{T}/{L.SCHEDULER_STATE}: last_epoch must be a non-negative integer (the schedule's step), not "
        "'four'; the checkpoint is damaged: resume from step 2, the newest step folder before it, with "
        "--resume=true --resume_from=2, which deletes the step folders after it (000004)"
    )
    assert (run / L.CHECKPOINTS_DIR / "000002").is_dir() and step.is_dir()


# --- config.json: one verdict, one line ---------------------------------------------------------


def test_inspect_and_every_loader_agree_on_a_config_json_its_policy_rejects(saved: Path, tmp_path: Path):
    run, step = copy_run(saved, tmp_path)
    config = step / P / L.POLICY_CONFIG
    config.write_text(json.dumps({**json.loads(config.read_text()), "dim_model": "four"}))
    (step / MANIFEST).unlink()
    problem = (f"{P}/{L.POLICY_CONFIG}: not a valid 'act' config: dim_model: Input should be a valid integer, "
               "unable to parse string as an integer (got 'four')")

    inspected = lerobot("inspect-checkpoint", str(step), cwd=tmp_path)
    assert one_line(inspected) == problem
    assert f"resumable: no ({problem})" in inspected.stdout and f"loadable with --policy.path: no ({problem})" in \
        inspected.stdout

    resumed = lerobot("train", "--resume=true", f"--output_dir={run}", "--steps=6", cwd=tmp_path, timeout=120)
    assert one_line(resumed) == f"{step}/{problem}; the checkpoint is damaged: {resume_advice(step)}"
    for args in (COMMANDS["eval"](step, tmp_path), COMMANDS["train --policy.path"](step, tmp_path)):
        assert one_line(lerobot(*args, cwd=tmp_path)) == f"{step}/{problem}; the checkpoint is damaged: {LOAD_ADVICE}"
    assert not (run / L.CHECKPOINTS_DIR / "000006").exists()


# --- evaluation folders -------------------------------------------------------------------------


@pytest.mark.parametrize("inside", ["eval/000008", "", "checkpoints/000004/my_eval"])
def test_eval_into_a_training_run_folder_is_refused(saved: Path, tmp_path: Path, inside: str):
    run, step = copy_run(saved, tmp_path)
    before = files_of(run)
    output = run / inside if inside else run
    line = one_line(lerobot("eval", f"--policy.path={step}", "--eval.n_episodes=1", f"--output_dir={output}",
                            cwd=tmp_path), codes=(2,))
    assert line.startswith(f"--output_dir={output} is inside the training run folder {run}, which belongs to that "
                           "run"), line
    assert line.endswith("choose an --output_dir outside it (nothing was written)"), line
    assert files_of(run) == before


@pytest.mark.slow  # it trains two steps and evaluates
def test_an_evaluation_during_training_never_replaces_an_earlier_one(saved: Path, tmp_path: Path):
    """Resumed from step 4, the run evaluates step 6 again: eval/000006 of the first attempt stays."""
    run, step = copy_run(saved, tmp_path)
    earlier = run / "eval" / "000006"
    earlier.mkdir(parents=True)
    (earlier / "eval_info.json").write_text('{"from": "the attempt before the resume"}')
    done = lerobot("train", "--resume=true", f"--config_path={step / P / L.TRAIN_CONFIG}", "--steps=6",
                   "--save_freq=2", "--eval_freq=6", "--eval.n_episodes=1", "--eval.max_episodes_rendered=0",
                   "--env.episode_length=10", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (earlier / "eval_info.json").read_text() == '{"from": "the attempt before the resume"}'
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["000006", "000006.2"]
    assert json.loads((run / "eval" / "000006.2" / "eval_info.json").read_text())["setup"]["step"] == 6
    assert (f"eval step 6: {earlier} holds an earlier evaluation of this step (from before the run resumed); "
            f"this one is {run / 'eval' / '000006.2'}, and nothing was overwritten") in done.stderr
