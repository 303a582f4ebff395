"""LeRobot's ACT trained side by side: by LeRobot's own ``lerobot-train`` and by lerobot-kit's
``lerobot train --policy.type=lerobot_act``, on the same LeRobot v3.0 video dataset, with
the same config, batch, data workers and steps, one process each, one after the other.

Run it in the bridge's venv (the one ``ci.sh`` builds):

    python tools/benchmark.py --steps=30 --batch_size=8

Both tools are timed from the outside, the same way: each is a child process whose
output lines are stamped as they arrive (``--log_freq=1``: one line per step), and whose
process tree (workers included) is sampled for memory. Reported per tool:

* samples/s: steps after the first ``warmup`` ones x batch / the time they took, from the
  line stamps (so start-up and the first steps' allocations are excluded);
* data-wait share: the tool's own per-step data time (``data_s``, which LeRobot's
  includes its preprocessor in) over the measured time per step;
* peak RSS of the training process, and peak PSS of its whole tree (PSS splits pages
  shared with forked workers, so they are not counted twice);
* time to first step: from launch to the first step's line.

``--json FILE`` also writes the figures with the date, machine and versions (the bridge
README's table is rendered from ``benchmarks/results/cpu-bridge-act.json`` by the
repository's ``benchmarks/render_docs.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))  # the repository's result files and their tables
from _common import result_header  # noqa: E402
from render_docs import comparison_table  # noqa: E402
from toy_dataset import make_dataset  # noqa: E402 - tools/ is not a package

BIN = Path(sys.executable).parent
REPO_ID = "bench/reach"
# LeRobot's ACT at its default sizes, without downloaded backbone weights; one learning
# rate for all parameters (LeRobot's default backbone rate equals its main rate).
ACT = ["--policy.pretrained_backbone_weights=null"]
STEP_LINE = {"lerobot-train": re.compile(r"step:(\d+)\S* .*data_s:([\d.]+)"),
             "lerobot train": re.compile(r"step (\d+)/\d+ .*data_s ([\d.]+)")}


@dataclass
class Measured:
    name: str
    start: float
    steps: list[tuple[float, int, float]] = field(default_factory=list)  # (arrival, step, data_s)
    peak_rss: int = 0
    peak_pss: int = 0
    output: list[str] = field(default_factory=list)


def watch_memory(process: psutil.Process, measured: Measured, done: threading.Event) -> None:
    while not done.is_set():
        try:
            tree = [process, *process.children(recursive=True)]
            measured.peak_rss = max(measured.peak_rss, process.memory_info().rss)
            measured.peak_pss = max(measured.peak_pss, sum(p.memory_full_info().pss for p in tree))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        done.wait(0.5)


def run(name: str, command: list[str], workdir: Path) -> Measured:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(workdir / "hf"), "PYTHONUNBUFFERED": "1"}
    measured = Measured(name, time.perf_counter())
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir, env=env)
    done = threading.Event()
    watcher = threading.Thread(target=watch_memory, args=(psutil.Process(child.pid), measured, done), daemon=True)
    watcher.start()
    assert child.stdout is not None
    for line in child.stdout:
        measured.output.append(line)
        match = STEP_LINE[name].search(line)
        if match:
            measured.steps.append((time.perf_counter(), int(match.group(1)), float(match.group(2))))
    child.wait()
    done.set()
    watcher.join()
    if child.returncode != 0:
        sys.exit(f"{name} failed (exit {child.returncode}):\n{''.join(measured.output[-40:])}")
    return measured


def summary(measured: Measured, batch_size: int, warmup: int) -> dict[str, float]:
    if len(measured.steps) <= warmup + 1:
        sys.exit(f"{measured.name}: only {len(measured.steps)} step lines; raise --steps")
    timed = measured.steps[warmup:]
    seconds = timed[-1][0] - timed[0][0]
    per_step = seconds / (len(timed) - 1)
    data_s = sum(d for _, _, d in timed[1:]) / (len(timed) - 1)
    return {
        "samples_per_s": batch_size / per_step,
        "data_wait_share": data_s / per_step,
        "peak_rss_gib": measured.peak_rss / 2**30,
        "peak_pss_gib": measured.peak_pss / 2**30,
        "first_step_s": measured.steps[0][0] - measured.start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/lerobot-kit-bridge-benchmark"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5, help="First steps left out of samples/s.")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--episode_length", type=int, default=60)
    parser.add_argument("--image", default="96x128", help="Camera height x width.")
    parser.add_argument("--json", type=Path, help="Also write the figures, date, machine and versions to this file.")
    args = parser.parse_args()

    root = args.workdir / "data"
    if not (root / "meta" / "info.json").is_file():
        height, width = (int(v) for v in args.image.split("x"))
        make_dataset(root, REPO_ID, episodes=args.episodes, length=args.episode_length, image_hw=(height, width))
    common = [f"--dataset.repo_id={REPO_ID}", f"--dataset.root={root}", f"--batch_size={args.batch_size}",
              f"--steps={args.steps}", f"--num_workers={args.num_workers}", "--log_freq=1", "--seed=1000",
              "--save_checkpoint=false", *ACT]
    theirs = [str(BIN / "lerobot-train"), *common, "--policy.type=act", "--policy.device=cpu",
              "--policy.push_to_hub=false", "--dataset.video_backend=pyav", "--wandb.enable=false",
              f"--output_dir={args.workdir / 'lerobot_train'}"]
    ours = [str(BIN / "lerobot"), "train", *common, "--policy.type=lerobot_act", "--optimizer.lr=1e-5",
            "--optimizer.weight_decay=1e-4", f"--output_dir={args.workdir / 'lerobot_kit'}"]
    for out in ("lerobot_train", "lerobot_kit"):
        subprocess.run(["rm", "-rf", str(args.workdir / out)], check=True)
    results = {m.name: summary(m, args.batch_size, args.warmup)
               for m in (run("lerobot-train", theirs, args.workdir), run("lerobot train", ours, args.workdir))}
    print(f"ACT, {args.steps} steps of batch {args.batch_size}, {args.num_workers} data worker(s), image {args.image}")
    print(comparison_table(results["lerobot-train"], results["lerobot train"]))
    if args.json is not None:
        args.json.write_text(json.dumps({
            **result_header("contrib/lerobot-kit-lerobot/tools/benchmark.py", sys.argv[1:]),
            "comparison": {"settings": {k: v for k, v in vars(args).items() if k not in ("workdir", "json")},
                           "lerobot-train": results["lerobot-train"], "lerobot train": results["lerobot train"]},
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()
