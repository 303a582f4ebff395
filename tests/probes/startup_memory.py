"""How much memory each rank takes to start a run (one rank of a job).

Usage: python startup_memory.py OUT_DIR TRAIN_FLAGS...  (under torchrun). Each rank runs
``prepare_run``, everything ``lerobot train`` does before its first step (model built,
sharded, initial weights in place, optimizer made), and writes to ``OUT_DIR/result<N>.json``
its resident memory before and its peak after, and the bytes of the whole model. The peak
(``VmHWM``, reset to the resident set just before ``prepare_run`` through
``/proc/self/clear_refs``) is the kernel's count, so a full copy of the model held for any
moment during start-up shows in it, and nothing allocated and freed before it (imports,
process-group set-up) hides it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torch.distributed.tensor import DTensor

from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.distributed.process_group import init_distributed, shutdown
from lerobot_kit.core.run.prepare import prepare_run, setup_logging


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the resident set now


def main() -> None:
    out, args = Path(sys.argv[1]), sys.argv[2:]
    config = parse_train_config(args)
    ctx = init_distributed(120)
    setup_logging(ctx.is_main)
    reset_peak()
    before = peak_rss_bytes()
    prepared = prepare_run(config, ctx)
    after = peak_rss_bytes()
    params = list(prepared.run.parallel.model.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in params)  # DTensor numel is the full size
    result = {
        "rank": ctx.rank,
        "before": before,
        "after": after,
        "model_bytes": model_bytes,
        "all_sharded": all(isinstance(p, DTensor) for p in params),
    }
    shutdown(ctx)
    (out / f"result{ctx.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
