"""5. ``lerobot convert-dcp``: throughput against this disk, and peak memory.

The input is the FSDP(2) ``dcp`` checkpoint of the ``checkpoints`` benchmark (>=100 M
parameters). Alternating five times (A B B A A ...), this benchmark (a) writes a file of
the same size to the same folder in 16 MiB blocks and fsyncs it — the disk's sequential
write speed now — and (b) runs the real console command ``lerobot convert-dcp
--overwrite=true`` whose own report gives bytes and seconds (the shards hashed against
``checksums.json`` by a thread beside the write, write with the output's sha256, fsync,
rename, the manifest updated), into a folder whose previous output was deleted first, as
the reference deletes its file. The disk's speed on a shared machine swings several-fold
from one write to the next, so the row is the median of the five per-pair ratios, with
their range. The goal is at least half the disk's speed.

Memory: the command's peak RSS (its ``VmHWM``, sampled) minus the peak RSS of an
interpreter that merely imports the command's modules, against the largest tensor in
the checkpoint (read from the DCP metadata): the converter streams, so the excess
must stay within two largest tensors.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from _common import (
    Context,
    Result,
    Row,
    alternate,
    clean_env,
    console_script,
    disk_write_speed,
    judge,
    paired,
    run_timed,
)
from checkpoint_io import large_checkpoint

NAME = "convert_dcp"
SPEED_GOAL = ">= 0.5"
RSS_GOAL = "<= 2"
_SUMMARY = re.compile(r"converted (\d+) tensors, .* in ([0-9.]+)s")


def _tensor_bytes(shards: Path) -> list[int]:
    from lerobot_kit.core.layout.dcp_metadata import read_dcp_metadata, tensor_entries

    entries = tensor_entries(read_dcp_metadata(shards)).values()
    return [math.prod(e.size) * e.properties.dtype.itemsize for e in entries]


def run(ctx: Context) -> Result:
    step_dir, params = large_checkpoint(ctx)
    pretrained = step_dir / "pretrained_model"
    sizes = _tensor_bytes(pretrained / "pytorch_model_fsdp_0")
    total, largest = sum(sizes), max(sizes)
    env = clean_env(ctx.workdir)
    command = [console_script("lerobot"), "convert-dcp", f"--checkpoint_dir={step_dir}", "--overwrite=true"]
    peaks: list[int | None] = []
    walls: list[float] = []

    def convert() -> float:
        # The previous pair's output is deleted outside the timer, as the disk reference
        # deletes its file: replacing it would time the file system freeing 0.4 GB too.
        (pretrained / "model.safetensors").unlink(missing_ok=True)
        timed = run_timed(command, env, timeout=600, peak_rss=True)
        match = _SUMMARY.search(timed.stdout)
        if match is None:
            raise RuntimeError(f"convert-dcp printed no summary: {timed.stdout!r}")
        peaks.append(timed.peak_rss)
        walls.append(timed.seconds)
        return total / float(match.group(2))

    speeds, disk = alternate(ctx.pick(1, 5), convert, lambda: disk_write_speed(pretrained, total))
    baseline = run_timed(
        [sys.executable, "-c", "import lerobot_kit.cli.main, lerobot_kit.cli.convert_dcp, "
         "lerobot_kit.core.offline.convert"], env, timeout=120, peak_rss=True,
    ).peak_rss
    stats = paired(speeds, disk)
    excess = max(peaks) - baseline
    result = Result(details={
        "params": params, "bytes": total, "largest_tensor_bytes": largest, "convert_Bps": speeds, "disk_Bps": disk,
        "convert_wall_s": walls, "peak_rss": peaks, "import_baseline_rss": baseline, "ratio_range": stats,
    })
    result.rows.append(Row(
        "throughput vs disk sequential write (fsync)", stats["ours"] / 1e6, stats["reference"] / 1e6, "MB/s",
        stats["ratio"], SPEED_GOAL, judge(stats["ratio"], SPEED_GOAL),
        f"{total / 1e6:.0f} MB; median of {stats['pairs']} pairs, ratio {stats['ratio_min']:.2f}-"
        f"{stats['ratio_max']:.2f}; shards hashed against checksums.json beside write + sha256 + fsync, "
        "by the command's clock",
    ))
    result.rows.append(Row(
        "peak RSS above import baseline vs largest tensor", excess / 1e6, largest / 1e6, "MB",
        excess / largest, RSS_GOAL, judge(excess / largest, RSS_GOAL), f"import baseline {baseline / 1e6:.0f} MB",
    ))
    return result
