"""``tools/benchmark.py``, the comparison with LeRobot's ``lerobot-train``, run as a user runs
it, for π0.5 at the tests' sizes in bf16 on the CPU: both tools train the same LeRobot
policy on the same data, two cameras (LeRobot's π0.5 tokenizing with the stand-in it finds
under PaliGemma's name; lerobot-kit with the fused attention), and the figures come with
the step's FLOPs from ``lerobot plan``, every run's own output kept beside them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import env

TOOL = Path(__file__).resolve().parents[1] / "tools" / "benchmark.py"


def test_pi05_beside_lerobot_train(work: Path) -> None:
    out = work / "compare_pi05.json"
    command = [sys.executable, str(TOOL), "--policy=pi05", "--size=reduced", "--precision=bf16", "--steps=6",
               "--warmup=2", "--batch_size=2", "--episodes=2", "--episode_length=16", "--image=48x64", "--cameras=2",
               "--attention=sdpa",
               f"--workdir={work / 'compare'}", "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env(work), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    comparison = json.loads(out.read_text())["comparison"]
    settings = comparison["settings"]
    assert "--policy.type=pi05" in settings["lerobot_train_args"]
    assert "--policy.dtype=bfloat16" in settings["lerobot_train_args"]
    assert {"--policy.type=lerobot_pi05", "--accelerator.mixed_precision=bf16",
            "--policy.attention=sdpa"} <= set(settings["lerobot_kit_args"])
    assert settings["step_flops"] > 0
    for tool in ("lerobot-train", "lerobot train"):
        figures = comparison[tool]
        assert figures["samples_per_s"] > 0 and figures["first_step_s"] > 0 and figures["peak_rss_gib"] > 0
        assert "peak_gpu_gib" not in figures and "mfu" not in figures  # no GPU here
    logged = (work / "compare" / "lerobot-train.log").read_text()
    assert " step:6 " in logged  # LeRobot's own loop ran to the last step
    assert (work / "compare" / "data-48x64-2cams" / "videos" / "observation.images.left").is_dir()
    kept = out.with_suffix(".log").read_text()
    assert "===== lerobot-train run 1 =====" in kept and "===== lerobot train run 1 =====" in kept
    assert "| samples/s |" in result.stdout  # the printed table
