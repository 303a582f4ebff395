"""The check a machine with one CUDA GPU gets: what runs there, and how fast.

CI machines have no accelerator, so no CUDA path is exercised by the test suite: the
CUDA device chosen at start-up, autocast in bf16 and fp16 with the loss scaler on CUDA,
activation checkpointing and ``torch.compile`` with inductor's GPU kernels, the CUDA RNG
state in checkpoints, pinned-memory loading, a resume, a restart after a killed process,
PEFT, the non-finite guard and evaluation. This script runs each of them through the
installed ``lerobot`` command as a user would, then measures ACT at LeRobot's sizes
(``dim_model`` 512, feed-forward 3200, 4+1 layers, chunk 100, resnet18, one 480×640
camera, batch 8) on a LeRobot v3.0 video dataset recorded as LeRobot records (SVT-AV1,
GOP 2), with the default DataLoader workers: samples/s, the share of the step spent
waiting for data, peak GPU memory and model FLOP utilisation (MFU: FLOPs of one training
step counted by ``torch.utils.flop_counter`` on the real batch, per second, over the
GPU's dense bf16 peak).

One GPU means one process: NCCL refuses two ranks on one device, and a launch maps each
local rank to its own GPU, so DDP, FSDP and HSDP need two GPUs or more.

``python benchmarks/gpu.py --out DIR [--workdir DIR] [--smoke] [--note TEXT]`` writes ``gpu.json``
(the date, command, machine and versions, every figure, each run's log tail: copied to
``benchmarks/results/``, the result file docs/gpu.md's tables are rendered from) and
``gpu.md`` (a quick look at the same figures) into ``--out``,
after each finished part, so a run cut short still reports what it did. ``--smoke`` runs
the same steps at toy sizes (on CPU where no GPU is present) to check the script itself.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import LEROBOT_ACT, REPO, console_script, logged_rows, peak_bf16_flops, result_header

ACT_LEROBOT = [*LEROBOT_ACT, "--policy.vision_backbone=resnet18"]
ACT_TOY = ["--policy.dim_model=32", "--policy.n_heads=2", "--policy.dim_feedforward=64",
           "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1", "--policy.chunk_size=5",
           "--policy.n_action_steps=5", "--policy.vision_backbone=resnet18"]
BF16 = "--accelerator.mixed_precision=bf16"
AC = "--accelerator.activation_checkpointing=true"
COMPILE = "--accelerator.compile=true"
WORKERS_12 = "--num_workers=12"
# (name, batch, flags): batch 8 with the default workers, as LeRobot trains ACT; batch 64
# with more workers, to see how far one GPU goes.
SETTINGS = [
    ("fp32", 8, []),
    ("bf16", 8, [BF16]),
    ("bf16 + activation checkpointing", 8, [BF16, AC]),
    ("fp16 (loss scaler)", 8, ["--accelerator.mixed_precision=fp16"]),
    ("bf16 + compile", 8, [BF16, COMPILE]),
    ("bf16 + activation checkpointing + compile", 8, [BF16, AC, COMPILE]),
    ("bf16 + activation checkpointing + compile, dropout 0", 8, [BF16, AC, COMPILE, "--policy.dropout=0"]),
    ("fp32, 12 workers", 64, [WORKERS_12]),
    ("bf16, 12 workers", 64, [BF16, WORKERS_12]),
    ("bf16 + activation checkpointing, 12 workers", 64, [BF16, AC, WORKERS_12]),
    ("bf16 + compile, 12 workers", 64, [BF16, COMPILE, WORKERS_12]),
]


class Report:
    """Results gathered part by part and written out after each, so a cut-short run still tells."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.data: dict[str, Any] = {"machine": {}, "versions": {}, "checks": [], "speed": []}
        out.mkdir(parents=True, exist_ok=True)

    def check(self, name: str, ok: bool, detail: str, **extra: Any) -> None:
        self.data["checks"].append({"check": name, "ok": ok, "detail": detail, **extra})
        print(f"[{'ok' if ok else 'FAILED'}] {name}: {detail}", flush=True)
        self.write()

    def speed(self, row: dict[str, Any]) -> None:
        self.data["speed"].append(row)
        print(f"[speed] {json.dumps(row)}", flush=True)
        self.write()

    def write(self) -> None:
        (self.out / "gpu.json").write_text(json.dumps(self.data, indent=1))
        (self.out / "gpu.md").write_text(markdown(self.data))


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    v = data["versions"]
    lines = [f"{m.get('gpu', '?')}, torch {v.get('torch', '?')}, CUDA {v.get('cuda', '?')}, "
             f"{m.get('cores', '?')} CPU cores", "",
             "| setting | batch | samples/s | data wait / step | peak GPU memory | MFU (bf16 peak) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in data["speed"]:
        if "error" in r:
            lines.append(f"| {r['setting']} | {r['batch']} | failed: {r['error']} | | | |")
            continue
        mfu = f"{r['mfu'] * 100:.1f}%" if r.get("mfu") is not None else "n/a"
        lines.append(f"| {r['setting']} | {r['batch']} | {r['samples_per_s']:.1f} | {r['data_share'] * 100:.1f}% | "
                     f"{r['peak_gpu_gb']:.2f} GB | {mfu} |")
    lines += ["", "| check | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['check']} | {'ok' if c['ok'] else 'FAILED'} | {c['detail']} |" for c in data["checks"]]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- running lerobot


def run(args: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a command, its output to ``log``; the exit code and the log's tail."""
    with log.open("w") as handle:
        try:
            code = subprocess.run(args, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            code = 124
    text = log.read_text(errors="replace")
    return code, text[-1500:]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The training rows of a run's log (evaluation rows have no loss)."""
    return [row for row in logged_rows(run_dir) if "loss" in row]


def train_in_process(argv: list[str], peak_file: str) -> None:
    """``lerobot train`` in this process, recording the GPU's peak memory when it exits."""
    import torch

    def record() -> None:
        if torch.cuda.is_available():
            Path(peak_file).write_text(json.dumps({"allocated": torch.cuda.max_memory_allocated(),
                                                   "reserved": torch.cuda.max_memory_reserved()}))

    atexit.register(record)
    from lerobot_kit.cli.main import cli

    sys.argv = ["lerobot", "train", *argv]
    cli()


# ----------------------------------------------------------------------------- checks


def functional_checks(report: Report, work: Path, smoke: bool) -> None:
    """The product's CUDA paths on the embedded reach data, each through ``lerobot``."""
    lerobot = [console_script("lerobot")]
    steps = 60 if smoke else 400
    run_dir = work / "reach"
    base = [f"--output_dir={run_dir}", f"--log_freq={steps // 4}", f"--save_freq={steps // 2}"]
    code, tail = run([*lerobot, "train", f"--steps={steps}", *base], work / "reach.log", 600)
    rows = metrics(run_dir)
    falls = bool(rows) and rows[-1]["loss"] < rows[0]["loss"] * 0.5
    report.check("train, default reach job", code == 0 and falls,
                  f"exit {code}, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, "
                  f"{rows[-1]['samples_per_s']:.0f} samples/s" if rows else f"exit {code}", log=tail)

    code, tail = run([*lerobot, "train", f"--steps={steps * 3 // 2}", "--resume=true", *base],
                     work / "resume.log", 600)
    rows = metrics(run_dir)
    report.check("resume to 1.5x the steps", code == 0 and bool(rows) and rows[-1]["step"] == steps * 3 // 2,
                 f"exit {code}, last logged step {rows[-1]['step'] if rows else None}", log=tail)

    code, tail = run([*lerobot, "inspect-checkpoint", str(run_dir / "checkpoints/last"), "--json"],
                     work / "inspect.log", 120)
    report.check("inspect-checkpoint --json (checksums verified)", code == 0, f"exit {code}", log=tail)

    eval_dir = work / "eval"
    episodes = 4 if smoke else 20
    code, tail = run([*lerobot, "eval", f"--policy.path={run_dir}/checkpoints/last",
                      f"--eval.n_episodes={episodes}", "--eval.max_episodes_rendered=1", f"--output_dir={eval_dir}"],
                     work / "eval.log", 300)
    info = json.loads((eval_dir / "eval_info.json").read_text()) if (eval_dir / "eval_info.json").is_file() else {}
    detail = f"exit {code}"
    if info:
        detail += (f", success {info['aggregated']['pc_success']:.0f}% over {episodes} episodes (scripted expert "
                   f"{info['expert']['aggregated']['pc_success']:.0f}%), {len(info['video_paths'])} video")
    report.check("eval", code == 0 and bool(info), detail, log=tail)

    lora_dir = work / "lora"
    code, tail = run([*lerobot, "train", f"--policy.path={run_dir}/checkpoints/last", "--peft.method_type=LORA",
                      "--optimizer.lr=1e-3", f"--steps={steps // 4}", f"--log_freq={steps // 8}",
                      f"--output_dir={lora_dir}"], work / "lora.log", 300)
    rows = metrics(lora_dir)
    report.check("LoRA fine-tune from the checkpoint", code == 0 and bool(rows),
                 f"exit {code}, loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}" if rows else f"exit {code}",
                 log=tail)

    code, tail = run([*lerobot, "train", "--steps=20", "--log_freq=5", f"--output_dir={work / 'nan'}"],
                     work / "nan.log", 300, env={"LEROBOT_KIT_FAULT": "point=forward,step=5,action=nan"})
    last = [line for line in tail.splitlines() if line.strip()][-1:] or [""]
    report.check("NaN loss stops the run (fault at step 5)", code != 0 and "step 5" in tail,
                 f"exit {code}: {last[0][:160]}", log=tail)

    restart_checks(report, work, lerobot, smoke)


def fp16_check(report: Report, work: Path, smoke: bool) -> None:
    """fp16 autocast with the loss scaler on the default reach job: the scaler skips the
    overflowing first steps and backs off, then the loss falls."""
    out = work / "fp16"
    steps = 40 if smoke else 300
    code, tail = run([*[console_script("lerobot")], "train", "--accelerator.mixed_precision=fp16", f"--steps={steps}",
                      f"--log_freq={steps // 4}", "--save_freq=100000", f"--output_dir={out}"], work / "fp16.log", 300)
    rows = metrics(out)
    falls = bool(rows) and rows[-1]["loss"] < rows[0]["loss"] * 0.5
    report.check("fp16 with the loss scaler, default reach job", code == 0 and falls,
                 f"exit {code}, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}" if rows else f"exit {code}",
                 log=tail)


def restart_checks(report: Report, work: Path, lerobot: list[str], smoke: bool) -> None:
    """A process SIGKILLed in backward under ``torchrun --max-restarts=1`` continues from its
    last checkpoint; its final weights are compared with a run never interrupted (CUDA
    kernels need not be bitwise deterministic, so the difference is reported)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--max-restarts=1",
                "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]
    flags = ["--steps=40", "--save_freq=10", "--log_freq=10"]
    straight, killed = work / "straight", work / "killed"
    code_a, _ = run([*lerobot, "train", *flags, f"--output_dir={straight}"], work / "straight.log", 300)
    code_b, tail = run([*torchrun, lerobot[0], "train", *flags, f"--output_dir={killed}"], work / "killed.log", 300,
                       env={"LEROBOT_KIT_FAULT": "point=backward,step=25"})
    detail = f"exits {code_a}/{code_b}"
    ok = code_a == 0 and code_b == 0
    if ok:
        diff = max_weight_difference(straight / "checkpoints/last", killed / "checkpoints/last")
        detail += f", restarted from step 20; max |weight difference| vs uninterrupted run: {diff:.3g}"
    report.check("restart after a SIGKILL in backward (torchrun --max-restarts=1)", ok, detail, log=tail)


def max_weight_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    wa = load_file(str(a / "pretrained_model/model.safetensors"))
    wb = load_file(str(b / "pretrained_model/model.safetensors"))
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


# ----------------------------------------------------------------------------- speed


def video_dataset(work: Path, smoke: bool) -> Path:
    """A LeRobot v3.0 dataset with one 480×640 AV1 camera at GOP 2, as LeRobot records."""
    sys.path.insert(0, str(REPO / "tests"))
    from lerobot_dataset_factory import write_lerobot_dataset

    folder = work / "video_dataset"
    os.environ.setdefault("SVT_LOG", "1")
    episode, count, shape = (40, 3, (48, 64)) if smoke else (200, 4, (480, 640))
    write_lerobot_dataset(folder, [episode] * count, video=True, image_shape=shape, codec="av1", fps=30,
                          keep_cameras=False)
    return folder


def step_flops(flags: list[str], work: Path) -> float:
    """FLOPs of one training step (forward and backward) of the run ``flags`` describe, on its real batch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from lerobot_kit.core.config.flags import parse_train_config
    from lerobot_kit.core.data.loader import batch_to_device
    from lerobot_kit.core.distributed.process_group import init_distributed, shutdown
    from lerobot_kit.core.run.prepare import prepare_run

    ctx = init_distributed(timeout_s=600)
    config = parse_train_config([*flags, "--num_workers=0", f"--output_dir={work / 'flops'}"])
    prepared = prepare_run(config, ctx)
    run_ = prepared.run
    batch = batch_to_device(next(iter(prepared.loader)), ctx.device, run_.meta.image_keys())
    batch = run_.preprocessor(batch)
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = run_.parallel.module(batch)
        loss.backward()
    flops = float(counter.get_total_flops())
    del prepared, run_, batch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    shutdown(ctx)
    return flops


def speed_matrix(report: Report, work: Path, smoke: bool, select: list[str]) -> None:
    import torch

    dataset = video_dataset(work, smoke)
    model = ACT_TOY if smoke else ACT_LEROBOT
    data = ["--dataset.repo_id=bench/video", f"--dataset.root={dataset}", "--save_checkpoint=false"]
    steps, log_freq = (12, 4) if smoke else (90, 30)
    settings = [(name, batch, extra) for name, batch, extra in SETTINGS if not select or name in select]
    flops: dict[int, float] = {}
    for batch in sorted({b for _, b, _ in settings}):
        flops[batch] = step_flops([*model, *data, f"--batch_size={batch}"], work)
    report.data["machine"]["step_flops"] = flops
    peak = peak_bf16_flops(report.data["machine"].get("gpu"))
    env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    for index, (name, batch, extra) in enumerate(settings):
        out_dir = work / f"speed{index}"
        peak_file = work / f"speed{index}.peak.json"
        argv = [*model, *data, f"--batch_size={batch}", f"--steps={steps}", f"--log_freq={log_freq}",
                f"--output_dir={out_dir}", *extra]
        workers = 12 if WORKERS_12 in extra else "default"
        started = time.perf_counter()
        code, tail = run([sys.executable, __file__, "_train", str(peak_file), *argv], work / f"speed{index}.log",
                         420, env)
        logged = metrics(out_dir)
        rows = logged[1:]  # the first window holds start-up and compilation
        if code != 0 or not rows:
            report.speed({"setting": name, "batch": batch, "workers": workers, "error": f"exit {code}", "log": tail})
            continue
        samples_per_s = sum(r["samples_per_s"] for r in rows) / len(rows)
        step_s = batch / samples_per_s
        gpu = json.loads(peak_file.read_text()) if peak_file.is_file() else {"allocated": 0, "reserved": 0}
        report.speed({
            "setting": name, "batch": batch, "workers": workers, "samples_per_s": samples_per_s, "step_s": step_s,
            "data_share": sum(r["data_s"] for r in rows) / len(rows) / step_s,
            "peak_gpu_gb": gpu["allocated"] / 1e9, "reserved_gpu_gb": gpu["reserved"] / 1e9,
            "mfu": flops[batch] / step_s / peak if peak and torch.cuda.is_available() else None,
            "loss_first_last": [logged[0]["loss"], rows[-1]["loss"]],
            "wall_s": time.perf_counter() - started,
        })


# ----------------------------------------------------------------------------- main


def provenance_with_gpu(note: str, smoke: bool) -> dict[str, Any]:
    """The result file's header: date, exact command, machine and versions (``_common.result_header``),
    with the CUDA build and the GPU's memory and compute capability."""
    import torch

    header = {**result_header("benchmarks/gpu.py", sys.argv[1:]), "smoke": smoke, "notes": note}
    header["versions"]["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        header["machine"].update(gpu_memory_gb=props.total_memory / 1e9,
                                 capability=list(torch.cuda.get_device_capability()))
    return header


def main() -> None:
    if sys.argv[1:2] == ["_train"]:
        train_in_process(sys.argv[3:], sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", choices=["checks", "fp16", "speed"], default=None)
    parser.add_argument("--select", action="append", default=[], help="a SETTINGS name to measure (repeatable)")
    parser.add_argument("--note", default="", help="recorded in gpu.json: what else ran on the machine")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="lerobot_gpu_"))
    work.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    report.data.update(provenance_with_gpu(args.note, args.smoke))
    report.write()
    if args.only in (None, "checks"):
        functional_checks(report, work, args.smoke)
    if args.only in (None, "fp16"):
        fp16_check(report, work, args.smoke)
    if args.only in (None, "speed"):
        speed_matrix(report, work, args.smoke, args.select)
    failed = [c["check"] for c in report.data["checks"] if not c["ok"]] + [
        r["setting"] for r in report.data["speed"] if "error" in r]
    print(markdown(report.data))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
