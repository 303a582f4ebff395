"""A rank whose launcher died stops as a preempted rank does: at the next step boundary, with a checkpoint.

torchrun's agent starts each rank in a session of its own, so when the agent itself dies
(SIGKILL, the OOM killer, a node daemon cleaning up) nothing reaches the ranks: they train
on as orphans that nobody will stop or restart, holding the accelerators and the output
folder's lock, and writing checkpoints that a rerun would race with. The kernel gives an
orphan another parent (init, or the nearest subreaper), so a rank that its launcher
started remembers its parent when ``train`` starts, and a thread compares it with
``os.getppid()`` every ``POLL_S`` seconds. Once it differs, the rank sends itself the
first of its stop signals (``--preemption.signals``), and the stop follows the path of
a preemption (``preemption``): the ranks agree on a step, save there and exit with
``EXIT_STOPPED`` (75), or, before the first step, exit with it at once. With no stop
signal configured, SIGTERM ends the rank at once.

``PR_SET_PDEATHSIG`` would signal the rank without a thread, but it fires when the
*thread* that started the rank exits, which need not be when the launcher does. A
launcher that died before ``train`` started (while the rank imported torch) goes
unnoticed: the parent remembered is then already the new one. A plain ``lerobot train``
is never watched (``LaunchEnv.parent_is_launcher``): its parent is a shell, whose end
(``nohup``, a closed terminal) does not mean that the run should stop.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping

from lerobot_kit.core.errors import LerobotError
from lerobot_kit.core.run.reliability.preemption import StopSignals

POLL_S = 0.5


class LauncherWatch:
    """Watches, from a thread, that this process's parent is still the launcher that started it."""

    def __init__(self, requests: StopSignals) -> None:
        self._launcher = os.getppid()
        self._requests = requests
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lerobot-launcher-watch", daemon=True)

    @classmethod
    def start_if_launched(cls, requests: StopSignals, env: Mapping[str, str] = os.environ) -> LauncherWatch | None:
        """A started watch when a launcher is this process's parent, else None."""
        if not _parent_is_launcher(env):
            return None
        watch = cls(requests)
        watch._thread.start()
        return watch

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._closed.wait(POLL_S):
            parent = os.getppid()
            if parent != self._launcher:
                self._stop(parent)
                return

    def _stop(self, parent: int) -> None:
        signals = self._requests.signals
        stop = signals[0] if signals else signal.SIGTERM
        how = (f"stopping as on {stop.name}: at the next step boundary, with a checkpoint" if signals
               else "ending now, as no stop signal is configured (--preemption.signals)")
        os.write(2, (f"rank {self._requests.rank}: the launcher that started this rank (pid {self._launcher}) is gone "
                     f"(its parent is now pid {parent}); {how}\n").encode())
        os.kill(os.getpid(), stop)


def _parent_is_launcher(env: Mapping[str, str]) -> bool:
    """What the launcher that recognises ``env`` says; False when none can read it (start-up
    reports that error next, in ``init_distributed``)."""
    from lerobot_kit.core.distributed.process_group import detect_launcher

    try:
        return detect_launcher(env).read(env).parent_is_launcher
    except LerobotError:
        return False
