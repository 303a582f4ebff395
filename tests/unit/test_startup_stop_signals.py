"""Stop handlers installed for start-up (``core.run.reliability.preemption``, ``core.run.reliability.guards``), with
real signals sent to this process: a request stops start-up at once, the loop takes the
same handlers over, and a run that ended on an agreed stop ignores signals while it exits."""

from __future__ import annotations

import os
import signal

import pytest

from lerobot_kit.core.config.schema import PreemptionConfig
from lerobot_kit.core.run.reliability.preemption import StartupStopped, StopSignals, installed_stop_signals


@pytest.fixture
def requests():
    handlers = StopSignals(PreemptionConfig(), starting=True)
    handlers.install()
    try:
        yield handlers
    finally:
        handlers.restore()
        for signum in handlers.signals:
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)


def test_a_signal_during_start_up_stops_it_where_it_is(requests: StopSignals) -> None:
    assert installed_stop_signals() is requests
    with pytest.raises(StartupStopped) as stopped:
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered before os.kill returns
    assert stopped.value.signal == signal.SIGUSR1 and requests.received == signal.SIGUSR1
    os.kill(os.getpid(), signal.SIGTERM)  # within 2 s: the same request relayed, while start-up unwinds


def test_once_the_loop_starts_a_signal_is_recorded(requests: StopSignals) -> None:
    requests.loop_started()
    os.kill(os.getpid(), signal.SIGTERM)
    assert requests.received == signal.SIGTERM  # recorded; nothing raised


def test_after_an_agreed_end_the_stop_signals_are_ignored_until_the_exit(requests: StopSignals) -> None:
    requests.ignore()
    assert installed_stop_signals() is None
    assert all(signal.getsignal(signum) is signal.SIG_IGN for signum in requests.signals)
    os.kill(os.getpid(), signal.SIGTERM)  # would end this test process if it were not ignored
    assert requests.received is None
