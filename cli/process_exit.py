"""How a process that started a process group ends: without the interpreter's native teardown.

After a run, such a process still holds torch's distributed objects (gloo's transport
threads among them); tearing them down in the interpreter's finalisation can abort the
process after the run has succeeded: "terminate called without an active exception",
SIGABRT, exit code -6, which a launcher reports as a failed rank (seen with gloo, torch
2.13, in about 1 of 30 two-rank runs on a loaded machine, after ``destroy_process_group``
and with no Python frame left). After an error the same teardown can wait forever for a
peer that is gone. So these processes exit with ``os._exit`` once the run is over and its
output is flushed; after a success the Python exit handlers run first (logging's flush,
the data workers' stop, those of plugins), as a normal exit would run them.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int, *, run_exit_handlers: bool) -> NoReturn:
    if run_exit_handlers:
        atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
