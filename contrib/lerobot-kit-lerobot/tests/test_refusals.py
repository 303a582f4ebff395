"""Folders and settings LeRobot cannot use are the user's input: one line naming the flag
(a ``ConfigError``, exit 2), never a prompt, never the folder's own code, never "plugin …
failed". Checked in this process on the bridge's own build path (the policy factory and
the processor factory a run calls), through the console script on a terminal, and, where
the refusal must come before anything reads a folder (a named pipe in it), through the
console script under a time limit."""

from __future__ import annotations

import ctypes
import json
import os
import pty
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, REPO_ID, TINY_ACT, env, tiny_pi, tiny_smolvla
from lerobot_kit.api import ConfigError, build_dataset, build_policy, parse_train_config
from lerobot_kit_lerobot.files_digest import DIGEST_KEY
from lerobot_kit_lerobot.modeling import LerobotPI05

MARKER_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import {base}
class {name}({base}):
    pass
"""


def with_code(source: Path, target: Path, config_file: str, changes: dict, module: str, name: str, base: str,
              marker: Path) -> Path:
    """A copy of ``source`` whose ``config_file`` asks for ``name`` from the folder's own
    ``module``.py, which leaves ``marker`` behind if it is ever imported."""
    folder = shutil.copytree(source, target)
    config = json.loads((folder / config_file).read_text())
    (folder / config_file).write_text(json.dumps({**config, **changes}))
    (folder / f"{module}.py").write_text(MARKER_CODE.format(marker=str(marker), name=name, base=base))
    return folder


def code_tokenizer(vla_assets: Path, target: Path, marker: Path) -> Path:
    """π0.5's tokenizer, but of a class only its own tokenization_custom.py defines (what
    transformers then offers to run)."""
    changes = {"tokenizer_class": "CustomTokenizer",
               "auto_map": {"AutoTokenizer": [None, "tokenization_custom.CustomTokenizer"]}}
    return with_code(vla_assets / "tokenizer", target, "tokenizer_config.json", changes, "tokenization_custom",
                     "CustomTokenizer", "PreTrainedTokenizerFast", marker)


def data(dataset_root: Path) -> list[str]:
    return [f"--dataset.repo_id={REPO_ID}", f"--dataset.root={dataset_root}", "--num_workers=0"]


def built(flags: list[str], dataset_root: Path) -> None:
    """What a run does first with these flags: the config, the dataset, the policy."""
    config = parse_train_config([*data(dataset_root), *flags])
    build_policy(config.policy, build_dataset(config).meta)


def refusal(flags: list[str], dataset_root: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        built(flags, dataset_root)
    line = str(refused.value)
    assert "\n" not in line, line
    return line


def test_a_tokenizer_that_asks_to_run_its_code_is_refused_on_a_terminal(tmp_path: Path, dataset_root: Path,
                                                                        vla_assets: Path) -> None:
    """Before, transformers asked "Do you wish to run the custom code? [y/N]" mid-run, and the
    "y" typed here ran the folder's file."""
    marker = tmp_path / "code_ran"
    tokenizer = code_tokenizer(vla_assets, tmp_path / "tokenizer", marker)
    flags = [f"--policy.tokenizer_name={tokenizer}" if f.startswith("--policy.tokenizer_name=") else f
             for f in tiny_pi(vla_assets)]
    command = [str(BIN / "lerobot"), "train", *data(dataset_root), *flags, f"--output_dir={tmp_path / 'run'}"]
    output, returncode = on_a_terminal(command, tmp_path, answer=b"y\n", timeout=240)
    # The terminal echoes the answer typed ahead; LeRobot may warn at import.
    lines = [line for line in output.splitlines() if line.strip() not in ("", "y") and not line.startswith("WARNING")]
    assert returncode == 2, output
    assert "Do you wish to run the custom code" not in output and not marker.exists(), output
    assert lines == [lines[-1]] and lines[-1].startswith(
        f"error: --policy.tokenizer_name={tokenizer}: {tokenizer} can only be loaded by running code of its own "
        "(tokenizer_config.json has auto_map"), output
    assert "lerobot-kit never runs a model folder's code" in lines[-1]
    assert not (tmp_path / "run").exists()


def on_a_terminal(command: list[str], cwd: Path, *, answer: bytes, timeout: float) -> tuple[str, int]:
    """Run ``command`` with a pseudo-terminal as its stdin, stdout and stderr, ``answer`` typed
    ahead; its output and exit code. Killed after ``timeout`` seconds."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, cwd=cwd, env=env(cwd),
                               start_new_session=True)
    os.close(follower)
    os.write(leader, answer)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed: every writer has exited
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif process.poll() is not None:
                break
        returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n"), returncode


def test_a_tokenizer_that_asks_to_run_its_code_is_refused_without_a_terminal(tmp_path: Path, dataset_root: Path,
                                                                             vla_assets: Path) -> None:
    """transformers' other answer without a terminal: an error advising trust_remote_code=True."""
    marker = tmp_path / "code_ran"
    tokenizer = code_tokenizer(vla_assets, tmp_path / "tokenizer", marker)
    config = parse_train_config([*data(dataset_root), *tiny_pi(vla_assets), f"--policy.tokenizer_name={tokenizer}"])
    with pytest.raises(ConfigError, match="can only be loaded by running code of its own") as refused:
        LerobotPI05.make_processors(config.policy, build_dataset(config).meta)
    assert str(refused.value).startswith(f"--policy.tokenizer_name={tokenizer}: ") and "\n" not in str(refused.value)
    assert not marker.exists()


def test_a_vlm_whose_config_asks_to_run_its_code_is_refused(tmp_path: Path, dataset_root: Path,
                                                            vla_assets: Path) -> None:
    marker = tmp_path / "code_ran"
    changes = {"model_type": "custom_vlm", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    vlm = with_code(vla_assets / "smolvlm", tmp_path / "vlm", "config.json", changes, "configuration_custom",
                    "CustomConfig", "PretrainedConfig", marker)
    line = refusal([*tiny_smolvla(vla_assets), f"--policy.vlm_model_name={vlm}"], dataset_root)
    assert line.startswith(f"--policy.vlm_model_name={vlm}: {vlm} can only be loaded by running code of its own "
                           "(config.json has auto_map"), line
    assert not marker.exists()


def test_a_vlm_of_another_architecture_is_one_line(tmp_path: Path, dataset_root: Path, vla_assets: Path) -> None:
    """Before: "plugin … failed: AttributeError: 'LlamaConfig' object has no attribute 'text_config'"."""
    from transformers import LlamaConfig

    vlm = shutil.copytree(vla_assets / "tokenizer", tmp_path / "llama")
    LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2).save_pretrained(vlm)
    line = refusal([*tiny_smolvla(vla_assets), f"--policy.vlm_model_name={vlm}"], dataset_root)
    assert line == (f"--policy.vlm_model_name={vlm}: its config.json describes a 'llama' model, and LeRobot's SmolVLA "
                    "is built on a SmolVLM ('smolvlm', such as HuggingFaceTB/SmolVLM2-500M-Video-Instruct): give the "
                    "files of a SmolVLM")


def test_pi_sizes_of_unequal_depths_are_one_line(dataset_root: Path, vla_assets: Path) -> None:
    """Before: "plugin … failed: ValueError: zip() argument 2 is shorter than argument 1"."""
    sizes = json.loads(next(f for f in tiny_pi(vla_assets) if f.startswith("--policy.sizes=")).split("=", 1)[1])
    sizes["gemma_300m"]["depth"] = 4
    flags = [f for f in tiny_pi(vla_assets) if not f.startswith("--policy.sizes=")]
    line = refusal([*flags, f"--policy.sizes={json.dumps(sizes)}"], dataset_root)
    assert line == ("--policy.sizes: the VLM (gemma_2b) 6 and the action expert (gemma_300m) 4 layers deep, and "
                    "LeRobot's pi05 runs layer i of both as one joint attention: give both towers one depth")


def test_act_with_lerobots_default_backbone_weights_offline_is_one_line(
    tmp_path: Path, dataset_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge README's first command on a machine without the network: torchvision's
    download of ImageNet's ResNet-18 fails (here for certain: through a closed local port)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))  # an empty cache
    for name in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    flags = [f for f in TINY_ACT if not f.startswith("--policy.pretrained_backbone_weights=")]
    line = refusal(flags, dataset_root)
    cached = tmp_path / "torch_home" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert line.startswith("--policy.pretrained_backbone_weights=ResNet18_Weights.IMAGENET1K_V1: torchvision "
                           "cannot fetch or read these weights (URLError: "), line
    assert line.endswith(f"without the network, put resnet18-f37072fd.pth (from "
                         f"https://download.pytorch.org/models/resnet18-f37072fd.pth) at {cached} (torch.hub's cache, "
                         "where a run with the network keeps it), or start the backbone from random weights with "
                         "--policy.pretrained_backbone_weights=null"), line


CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


def _without_file_capabilities() -> None:
    """As root, drop the capabilities that let root read a file its mode denies (so the mode
    denies root as it denies any user); an ordinary user needs nothing dropped."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


# How each entry is put in place of a file of the folder, and what the refusal calls it.
NOT_A_FILE = {
    "fifo": (os.mkfifo, "is a named pipe, not a file"),
    "dangling_link": (lambda path: path.symlink_to(path.parent / "moved_away.json"), "is a link to nothing ("),
    "folder": (os.mkdir, "is a folder where transformers reads a file"),
    "unreadable": (lambda path: path.chmod(0), "cannot be read (Permission denied, errno EACCES)"),
}


@pytest.mark.parametrize(("flag", "assets", "file", "kind"), [
    ("tokenizer_name", "tokenizer", "tokenizer_config.json", "fifo"),
    ("vlm_model_name", "smolvlm", "config.json", "fifo"),
    ("tokenizer_name", "tokenizer", "additional_chat_templates/tool_use.jinja", "fifo"),
    ("tokenizer_name", "tokenizer", "tokenizer.json", "dangling_link"),
    ("tokenizer_name", "tokenizer", "tokenizer_config.json", "folder"),
    ("vlm_model_name", "smolvlm", "processor_config.json", "unreadable"),
])
def test_a_files_folder_entry_that_is_not_a_readable_file_is_one_line_at_once(
    tmp_path: Path, dataset_root: Path, vla_assets: Path, flag: str, assets: str, file: str, kind: str
) -> None:
    """transformers takes a named pipe, a link to nothing or a folder for a missing file (a
    tokenizer without its settings then failed the first batch as an internal error), and a
    reader opening the pipe blocks for ever: the folder is refused when the flags are checked,
    before anything reads it, in one line naming the entry (exit 2), within the 10 s the
    console script is given."""
    folder = shutil.copytree(vla_assets / assets, tmp_path / assets)
    put, said = NOT_A_FILE[kind]
    if kind != "unreadable":  # the file itself stays, its mode denying every reader
        (folder / file).unlink(missing_ok=True)
        (folder / file).parent.mkdir(exist_ok=True)
    put(folder / file)
    flags = {"tokenizer_name": tiny_pi, "vlm_model_name": tiny_smolvla}[flag](vla_assets)
    flags = [f"--policy.{flag}={folder}" if f.startswith(f"--policy.{flag}=") else f for f in flags]
    result = subprocess.run(
        [str(BIN / "lerobot"), "train", *data(dataset_root), *flags, f"--output_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=tmp_path, env=env(tmp_path), timeout=10,
        preexec_fn=_without_file_capabilities if kind == "unreadable" else None,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: --policy: Value error, --policy.{flag}={folder}: {folder / file} {said}"), lines
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("flag", "unknown"), [("--policy.files_digest=x", "--policy.files_digest"),
                                             (f"--policy.{DIGEST_KEY}=x", "--policy.recorded")])
def test_the_recorded_folder_digest_is_no_flag(tmp_path: Path, dataset_root: Path, vla_assets: Path,
                                               flag: str, unknown: str) -> None:
    """The digest a run records of its tokenizer folder is the run's record: a flag naming it is
    refused in one line (exit 2), never silently dropped."""
    command = [str(BIN / "lerobot"), "train", *data(dataset_root), *tiny_pi(vla_assets), flag,
               f"--output_dir={tmp_path / 'run'}"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env(tmp_path), timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {unknown}: unknown flag"), lines


@pytest.mark.parametrize("key", [DIGEST_KEY, "files_digest"])
def test_a_recorded_config_with_its_folder_digest_reads_back(tmp_path: Path, dataset_root: Path,
                                                             vla_assets: Path, key: str) -> None:
    """What ``--config_path=<step>/pretrained_model/train_config.json`` reads: the digest the run
    recorded is dropped there, and the folder is digested again as it is now; also under the
    key earlier runs recorded it as (``files_digest``), which a resume compares alike."""
    from lerobot_kit_lerobot.files_digest import resume_views

    config = parse_train_config([*data(dataset_root), *tiny_pi(vla_assets)])
    recorded = config.model_dump(mode="json")
    assert recorded["policy"][DIGEST_KEY].startswith("sha256:")
    policy = {k: v for k, v in recorded["policy"].items() if k != DIGEST_KEY} | {key: recorded["policy"][DIGEST_KEY]}
    (tmp_path / "train_config.json").write_text(json.dumps({**recorded, "policy": policy}))
    again = parse_train_config([f"--config_path={tmp_path / 'train_config.json'}"])
    assert again.model_dump(mode="json")["policy"] == recorded["policy"]
    moved = {**recorded["policy"], "tokenizer_name": "/elsewhere/tokenizer"}  # the same files, another place
    assert resume_views("tokenizer_name", moved, policy)[0] == resume_views("tokenizer_name", moved, policy)[1]
