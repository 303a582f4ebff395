"""The bridge as installed: beside LeRobot without touching it, listed by ``lerobot``,
flags generated from LeRobot's configs, and bad flags refused in one line."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, REPO_ID, env, make_dataset, run, tiny_pi, tiny_smolvla

BRIDGE_SOURCE = Path(__file__).resolve().parents[1]


def file_hashes(distribution: str) -> dict[Path, str]:
    """Every file a distribution installed (its RECORD), by absolute path, with its sha256."""
    files = importlib.metadata.distribution(distribution).files or []
    located = (Path(f.locate()).resolve() for f in files)
    return {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in located if path.is_file()}


def test_installing_the_bridge_replaces_none_of_lerobots_files(tmp_path: Path) -> None:
    lerobot_before = file_hashes("lerobot")
    assert any(path.name == "lerobot-train" for path in lerobot_before)
    source = tmp_path / "lerobot-kit-lerobot"  # a copy: pip writes build files beside its source
    shutil.copytree(BRIDGE_SOURCE, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    install = subprocess.run(
        [str(BIN / "pip"), "install", "--no-deps", "--no-build-isolation", "--force-reinstall", str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stderr
    assert file_hashes("lerobot") == lerobot_before
    bridge = set(file_hashes("lerobot-kit-lerobot"))
    kit = set(file_hashes("lerobot-kit"))
    assert bridge and kit
    assert not (bridge | kit) & set(lerobot_before)
    # The console scripts stay apart: lerobot-kit's `lerobot`, LeRobot's `lerobot-*`, none from the bridge.
    assert (BIN / "lerobot").resolve() in kit
    assert not any(path.parent == BIN.resolve() for path in bridge)


def test_the_hook_module_imports_neither_torch_nor_lerobot() -> None:
    probe = "import sys, lerobot_kit_lerobot; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lerobot'}))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_lerobot_lists_the_bridged_policies(tmp_path: Path) -> None:
    listed = json.loads(run(["plugins", "--json"], tmp_path).stdout)
    text = json.dumps(listed)
    assert "lerobot_kit_lerobot" in text and "lerobot_act" in text and "lerobot_diffusion" in text


def test_flags_and_their_help_come_from_lerobots_config(tmp_path: Path) -> None:
    shown = run(["train", "--policy.type=lerobot_act", "--help"], tmp_path).stdout
    assert "--policy.dim_model" in shown and "The transformer blocks' main hidden dimension." in shown
    assert "--policy.normalization_mapping" in shown


def test_the_shipped_flag_schemas_are_those_of_the_installed_lerobot() -> None:
    from lerobot_kit_lerobot.configuration import SCHEMAS
    from lerobot_kit_lerobot.policies import BRIDGED
    from lerobot_kit_lerobot.schema_gen import all_schemas

    assert all_schemas(sorted(BRIDGED)) == SCHEMAS


def last_error_line(result: subprocess.CompletedProcess) -> str:
    """The error line a run ends with, once it is a usage error (exit 2) without a traceback;
    LeRobot's import-time warnings may come before it."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("WARNING")][-1]


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and lines[0].startswith("error:"), result.stderr
    return result.stderr


def test_a_misspelt_flag_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    result = run(["train", "--policy.type=lerobot_act", "--policy.dim_modle=64"], tmp_path, check=False)
    assert "--policy.dim_modle: unknown flag; did you mean --policy.dim_model?" in one_error_line(result)


def test_a_value_of_the_wrong_type_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    result = run(["train", "--policy.type=lerobot_diffusion", '--policy.down_dims=[16, "wide"]'], tmp_path, check=False)
    assert "--policy.down_dims.1: Input should be a valid integer" in one_error_line(result)


def test_settings_lerobot_refuses_are_one_line_with_lerobots_reason(tmp_path: Path) -> None:
    result = run(["train", "--policy.type=lerobot_act", "--policy.n_action_steps=200"], tmp_path, check=False)
    message = one_error_line(result)
    assert "LeRobot's ACTConfig refuses these settings" in message and "chunk size" in message, message


def test_a_policy_path_of_another_lerobot_type_names_the_right_flag(tmp_path: Path) -> None:
    pretrained = tmp_path / "pretrained_model"
    pretrained.mkdir()
    (pretrained / "config.json").write_text(json.dumps({"type": "diffusion"}))
    result = run(["train", "--policy.type=lerobot_act", f"--policy.path={pretrained}"], tmp_path, check=False)
    assert "use --policy.type=lerobot_diffusion" in one_error_line(result)
    assert env(tmp_path)["HF_HUB_OFFLINE"] == "1"


def test_lerobots_own_checkpointing_switch_is_refused_with_the_flag_to_use(tmp_path: Path) -> None:
    result = run(["train", "--policy.type=lerobot_pi05", "--policy.gradient_checkpointing=true"], tmp_path, check=False)
    assert ("--policy.gradient_checkpointing=true is LeRobot's own switch; under lerobot-kit use "
            "--accelerator.activation_checkpointing=true") in one_error_line(result)


def test_pi_sizes_lerobots_joint_attention_cannot_run_are_refused(tmp_path: Path) -> None:
    sizes = '{"gemma_2b": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 4, "num_kv_heads": 1, "head_dim": 8}}'
    result = run(["train", "--policy.type=lerobot_pi05", f"--policy.sizes={sizes}"], tmp_path, check=False)
    assert "gemma_2b.num_heads=4: LeRobot's joint attention assumes 8 heads per tower" in one_error_line(result)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policy.type=lerobot_pi05", "--policy.tokenizer_name=/nowhere/paligemma"],
         "--policy.tokenizer_name=/nowhere/paligemma: LeRobot cannot load PaliGemma's tokenizer"),
        (["--policy.type=lerobot_smolvla", "--policy.vlm_model_name=/nowhere/smolvlm"],
         "--policy.vlm_model_name=/nowhere/smolvlm: LeRobot cannot load its VLM's config and processor"),
    ],
)
def test_missing_vla_files_are_one_line_naming_the_flag(tmp_path: Path, dataset_root: Path, flags: list[str],
                                                        message: str) -> None:
    result = run(["train", "--dataset.repo_id=bridge/reach", f"--dataset.root={dataset_root}", *flags], tmp_path,
                 check=False)
    assert last_error_line(result).startswith(f"error: {message}"), result.stderr


@pytest.mark.parametrize(
    ("kind", "damaged", "content", "message"),
    [
        ("pi05", "tokenizer.json", "{}", "LeRobot cannot load PaliGemma's tokenizer (tokenizer.json, "
         "tokenizer_config.json) from it (KeyError: 'added_tokens')"),
        ("smolvla", "tokenizer_config.json", '{"chat_tem', "LeRobot cannot load its VLM's config and processor "
         "(config.json, processor and tokenizer files) from it (JSONDecodeError: Unterminated string"),
    ],
)
def test_damaged_vla_files_are_one_line_naming_the_flag(tmp_path: Path, dataset_root: Path, vla_assets: Path,
                                                        kind: str, damaged: str, content: str, message: str) -> None:
    """A file of the folder that fails inside transformers' loading (truncated, an entry
    missing) is the folder's fault, not the plugin's."""
    flags = tiny_pi(vla_assets) if kind == "pi05" else tiny_smolvla(vla_assets)
    source = vla_assets / ("tokenizer" if kind == "pi05" else "smolvlm")
    folder = shutil.copytree(source, tmp_path / "damaged")
    (folder / damaged).write_text(content)
    flag = "tokenizer_name" if kind == "pi05" else "vlm_model_name"
    flags = [f"--policy.{flag}={folder}" if f.startswith(f"--policy.{flag}=") else f for f in flags]
    result = run(["train", f"--dataset.repo_id={REPO_ID}", f"--dataset.root={dataset_root}", *flags], tmp_path,
                 check=False)
    assert last_error_line(result).startswith(f"error: --policy.{flag}={folder}: {message}"), result.stderr


def test_a_vla_on_a_dataset_without_a_camera_is_one_line(tmp_path: Path, vla_assets: Path) -> None:
    root = make_dataset(tmp_path / "no_camera", REPO_ID, episodes=2, length=8, image_hw=None)
    result = run(["train", f"--dataset.repo_id={REPO_ID}", f"--dataset.root={root}", *tiny_pi(vla_assets),
                  f"--output_dir={tmp_path / 'run'}"], tmp_path, check=False)
    assert last_error_line(result) == (
        "error: policy.type=lerobot_pi05 cannot use this dataset (features ['action', 'observation.state']): "
        "LeRobot's pi05 reads at least one camera image in every step, and the dataset has no image or video "
        "feature; train it on a dataset recorded with a camera"), result.stderr
    assert not (tmp_path / "run").exists()


def test_smolvla_loading_its_vlms_weights_from_a_folder_without_them_is_one_line(tmp_path: Path, dataset_root: Path,
                                                                                 vla_assets: Path) -> None:
    result = run(["train", f"--dataset.repo_id={REPO_ID}", f"--dataset.root={dataset_root}", "--num_workers=0",
                  *tiny_smolvla(vla_assets), "--policy.load_vlm_weights=true", f"--output_dir={tmp_path / 'run'}"],
                 tmp_path, check=False)
    assert result.returncode == 2 and last_error_line(result).startswith(
        f"error: --policy.vlm_model_name={vla_assets / 'smolvlm'}: LeRobot cannot load its VLM's config, processor "
        "and weights (config.json, processor and tokenizer files, model.safetensors: --policy.load_vlm_weights=true) "
        "from it (Error no file named model.safetensors"), result.stderr
    assert not (tmp_path / "run").exists()


def test_a_vla_on_a_dataset_without_task_texts_is_one_line(tmp_path: Path, dataset_root: Path,
                                                           vla_assets: Path) -> None:
    root = shutil.copytree(dataset_root, tmp_path / "no_tasks")
    (root / "meta" / "tasks.parquet").unlink()
    result = run(["train", f"--dataset.repo_id={REPO_ID}", f"--dataset.root={root}", "--num_workers=0",
                  *tiny_smolvla(vla_assets), f"--output_dir={tmp_path / 'run'}"], tmp_path, check=False)
    assert last_error_line(result) == (
        "error: policy.type=lerobot_smolvla tokenizes each frame's task text, and the dataset gives none (no "
        "meta/tasks.parquet, or frames without a task_index): give it its tasks as LeRobot records them"
    ), result.stderr
    assert not (tmp_path / "run").exists()  # a run that wrote nothing leaves no folder


def test_a_tokenizer_larger_than_the_vocabulary_is_one_line(tmp_path: Path, dataset_root: Path,
                                                           vla_assets: Path) -> None:
    """Without the check, torch's bare "index out of range in self" in the first step."""
    flags = [f.replace('"vocab_size": 320', '"vocab_size": 100') for f in tiny_pi(vla_assets)]
    assert flags != tiny_pi(vla_assets)
    result = run(["train", f"--dataset.repo_id={REPO_ID}", f"--dataset.root={dataset_root}", "--num_workers=0",
                  *flags, f"--output_dir={tmp_path / 'run'}"], tmp_path, check=False)
    line = last_error_line(result)
    assert line.startswith(f"error: --policy.tokenizer_name={vla_assets / 'tokenizer'}: the tokenizer gives token id "
                           ), result.stderr
    assert line.endswith("and the model's vocabulary has 100 entries (ids 0..99): give a tokenizer whose ids fit "
                         "the vocabulary, or a vocabulary that holds the tokenizer's (for π0/π0.5, --policy.sizes' "
                         "vocab_size)"), result.stderr
    assert not (tmp_path / "run").exists()


def documented_install() -> list[str]:
    """The one command the bridge's README gives to install lerobot-kit, its extras and the
    bridge beside LeRobot, as words (it runs from lerobot-kit's source folder)."""
    readme = (BRIDGE_SOURCE / "README.md").read_text()
    line = next(line for line in readme.splitlines()
                if line.startswith("pip install ") and "lerobot-kit-lerobot[" in line)
    return shlex.split(line.split("#", 1)[0])


def test_the_documented_install_keeps_lerobots_pins(tmp_path: Path) -> None:
    """pip honours the pins of the packages a command names or depends on, and no others: so
    ``pip install 'lerobot-kit[all]'`` alone into LeRobot's environment may take newer
    releases than LeRobot allows (transformers, for peft, upgrades huggingface_hub to 2.x,
    and LeRobot 0.6.1 no longer imports). The README's one command names the bridge, which
    depends on LeRobot, so LeRobot's pins are in the resolution. Resolved here from nothing
    installed (``--ignore-installed``, ``--dry-run``: a report, nothing written), the
    versions pip picks satisfy every requirement LeRobot 0.6.1 states."""
    words = documented_install()
    assert words[:2] == ["pip", "install"], words
    report = tmp_path / "report.json"
    result = subprocess.run(
        [str(BIN / "pip"), *words[1:], "--dry-run", "--ignore-installed", "--no-build-isolation", "--quiet",
         "--report", str(report)],
        cwd=BRIDGE_SOURCE.parents[1], capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    items = {item["metadata"]["name"].lower().replace("_", "-"): item
             for item in json.loads(report.read_text())["install"]}
    picked = {name: item["metadata"] for name, item in items.items()}
    lerobot = picked["lerobot"]
    assert lerobot["version"] == importlib.metadata.version("lerobot")
    assert {"lerobot-kit", "lerobot-kit-lerobot", "peft", "transformers", "huggingface-hub"} <= picked.keys()
    bridge_extras = items["lerobot-kit-lerobot"].get("requested_extras") or []
    lerobot_extras = {extra for pin in requirements(picked["lerobot-kit-lerobot"], bridge_extras)
                      if pin.name == "lerobot" for extra in pin.extras}
    kept = [pin for pin in requirements(lerobot, lerobot_extras) if pin.name != "lerobot"]
    assert {"huggingface-hub", "transformers", "peft"} <= {pin.name.lower().replace("_", "-") for pin in kept}
    for pin in kept:
        name = pin.name.lower().replace("_", "-")
        version = picked.get(name, {}).get("version")
        assert version is not None and version in pin.specifier, (str(pin), version)


def requirements(metadata: dict, extras: list[str] | set[str]) -> list:
    """The requirements a distribution's metadata (pip's report) states for these extras,
    following its references to its own extras (LeRobot's ``peft`` asks for ``lerobot[peft-dep]``)."""
    from packaging.requirements import Requirement

    pins = [Requirement(text) for text in metadata.get("requires_dist", [])]
    name = metadata["name"].lower().replace("_", "-")
    wanted, todo = set(), {"", *extras}
    while todo:
        extra = todo.pop()
        wanted.add(extra)
        for pin in pins:
            if pin.name.lower() == name and (pin.marker is None or pin.marker.evaluate({"extra": extra})):
                todo |= set(pin.extras) - wanted
    return [pin for pin in pins if any(pin.marker is None or pin.marker.evaluate({"extra": e}) for e in wanted)]
