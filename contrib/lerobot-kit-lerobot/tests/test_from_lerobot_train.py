"""A run that LeRobot's own ``lerobot-train`` wrote, met as a LeRobot user meets it with
lerobot-kit: inspected, resumed (refused in one line: its training state is LeRobot's
layout), and fine-tuned from with ``--policy.path`` alone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import BIN, REPO_ID, env, losses, run, train

LEROBOT_TINY_ACT = [
    "--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
    "--policy.pretrained_backbone_weights=null", "--policy.dim_model=32", "--policy.n_heads=2",
    "--policy.dim_feedforward=64", "--policy.n_encoder_layers=2", "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5", "--policy.n_action_steps=5",
]


def test_a_lerobot_train_run_is_inspected_refused_for_resume_and_fine_tuned_from(work: Path,
                                                                                 dataset_root: Path) -> None:
    native = work / "lerobot_native"
    command = [str(BIN / "lerobot-train"), f"--dataset.repo_id={REPO_ID}", f"--dataset.root={dataset_root}",
               "--dataset.video_backend=pyav", *LEROBOT_TINY_ACT, "--steps=2", "--save_freq=2", "--batch_size=4",
               "--num_workers=0", f"--output_dir={native}"]
    made = subprocess.run(command, capture_output=True, text=True, cwd=work, env=env(work), timeout=420)
    assert made.returncode == 0, made.stderr[-4000:]
    step = native / "checkpoints" / "000002"

    # LeRobot's layout: one problem (it cannot be resumed), not one per file of its training state.
    inspected = run(["inspect-checkpoint", str(step), "--json"], work, check=False)
    assert inspected.returncode == 1, inspected.stdout + inspected.stderr
    report = json.loads(inspected.stdout)
    assert len(report["problems"]) == 1 and "has no layout_version: an older layout" in report["problems"][0], report
    assert report["loadable"]["ok"] is not False, report["loadable"]

    # LeRobot's habit for a resume: its own train_config.json. One line, nothing written.
    resumed = run(["train", "--resume=true", f"--config_path={step / 'pretrained_model' / 'train_config.json'}"],
                  work, check=False)
    assert resumed.returncode == 2 and resumed.stderr.strip().splitlines() == [
        f"error: --config_path={step / 'pretrained_model' / 'train_config.json'}: a train_config.json that LeRobot's "
        "lerobot-train wrote: lerobot-kit neither reads LeRobot's settings nor resumes LeRobot's runs (its training "
        f"state is LeRobot's layout); start from its weights with --policy.path={step / 'pretrained_model'} and give "
        "the settings as flags (docs/configuration.md: Coming from lerobot-train)"], resumed.stderr
    assert sorted(p.name for p in (native / "checkpoints").iterdir()) == ["000002", "last"]

    # What that line says to do: --policy.path alone picks lerobot_act and trains.
    out = work / "from_lerobot_train"
    result = train(work, f"--policy.path={step / 'pretrained_model'}", f"--output_dir={out}", "--steps=2",
                   "--batch_size=4", "--log_freq=1", root=dataset_root)
    assert "policy lerobot_act |" in result.stderr and len(losses(out)) == 2
