"""Resume a run, dump the full state it restored, then keep training (one rank of a job).

Usage: python restore_probe.py DUMP_DIR TRAIN_FLAGS...  (under torchrun or alone). The
main process writes DUMP_DIR/model.safetensors and the full optimizer state exactly as
restored on this topology, before the first new step, so a test can compare them bit for
bit with what the checkpoint holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from lerobot_kit.core.checkpoint.training_state import save_full_optimizer
from lerobot_kit.core.distributed.process_group import init_distributed, shutdown
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.run.prepare import prepare_run, setup_logging
from lerobot_kit.core.run.reporting.tracking import NullTracker
from lerobot_kit.core.run.trainer import Trainer


def main() -> None:
    dump, args = Path(sys.argv[1]), sys.argv[2:]
    config = parse_train_config(args)
    ctx = init_distributed(120)
    setup_logging(ctx.is_main)
    prepared = prepare_run(config, ctx)
    run = prepared.run
    sharded = run.dims.sharded
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(run.parallel.model, options=options) if sharded else run.parallel.model.state_dict()
    optim_state = get_optimizer_state_dict(run.parallel.model, run.optimizer, options=options)
    if ctx.is_main:
        dump.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in model_state.items()}, str(dump / "model.safetensors"))
        save_full_optimizer(optim_state, dump)
    trainer = Trainer(run, iter(prepared.loader), prepared.sampler, prepared.start_step, prepared.position,
                      NullTracker())
    trainer.fit()
    shutdown(ctx)


if __name__ == "__main__":
    main()
