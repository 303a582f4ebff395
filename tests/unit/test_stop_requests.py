"""Stop requests (``core.run.reliability.preemption``), the test-only fault spec and the recognition of
a full disk, with real signals sent to real processes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import traceback

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from lerobot_kit.core.checkpoint.disk_space import is_disk_full, root_error
from lerobot_kit.core.config.flags import parse_train_config
from lerobot_kit.core.config.schema import PreemptionConfig
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.core.run.reliability.fault_injection import Fault
from lerobot_kit.core.run.reliability.preemption import StopAgreement, StopSignals


def test_the_first_signal_is_recorded_and_a_relayed_copy_is_ignored():
    requests = StopSignals(PreemptionConfig(), rank=0)
    agreement = StopAgreement(requests, distributed=False)
    requests.install()
    try:
        assert not agreement.stop_now()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # within 2 s: the same request, relayed
        assert requests.received == signal.SIGUSR1
        assert agreement.stop_now() and agreement.agreed == signal.SIGUSR1
    finally:
        requests.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_second_signal_after_the_grace_period_ends_the_process_at_once():
    program = textwrap.dedent("""
        import os, signal, time
        from lerobot_kit.core.config.schema import PreemptionConfig
        from lerobot_kit.core.run.reliability.preemption import StopSignals
        requests = StopSignals(PreemptionConfig(), rank=3)
        requests.install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2.2)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "rank 3: SIGTERM received; stopping at the next step boundary with a checkpoint" in result.stderr
    assert "rank 3: SIGTERM received again; exiting now without a checkpoint" in result.stderr


def test_which_signals_stop_a_run():
    assert PreemptionConfig().signal_numbers() == (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    assert PreemptionConfig(signals=["SIGUSR2"], interrupt=False).signal_numbers() == (signal.SIGUSR2,)
    with pytest.raises(ConfigError, match=r"^--preemption.signals: Value error, SIGKILL cannot be caught"):
        parse_train_config(['--preemption.signals=["SIGKILL"]'])
    with pytest.raises(ConfigError, match=r"'TERM' is not a signal name"):
        parse_train_config(['--preemption.signals=["TERM"]'])


def test_fault_spec_parses_and_refuses_with_one_line():
    assert Fault.parse("point=backward,step=25,rank=1") == Fault("backward", 25, rank=1)
    assert Fault.parse("point=forward,step=3,rank=1,action=hang,attempt=1").attempt == 1
    for text, problem in [("point=backward", "point and step are required"), ("point=nowhere,step=1", "point is one of"),
                          ("point=sync_save,step=2,action=hang", "only supports action=kill"),
                          ("point=forward,step=x", "step must be an integer"), ("steps=3", "not key=value")]:
        with pytest.raises(ConfigError, match=problem):
            Fault.parse(text)


def _dcp_failure(error: BaseException) -> CheckpointException:
    """What DCP raises on every rank when one rank's write failed."""
    try:
        raise error
    except BaseException as exc:  # noqa: BLE001
        return CheckpointException("save failed", {1: (exc, traceback.extract_tb(exc.__traceback__))})


def test_a_full_disk_is_recognised_through_the_wrappers(tmp_path):
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(enospc, tmp_path)
    assert is_disk_full(_dcp_failure(enospc), tmp_path)
    assert is_disk_full(RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                     'message: "No space left on device" })'), tmp_path)
    other = RuntimeError("unexpected pos 704 vs 598")
    assert not is_disk_full(_dcp_failure(other), tmp_path)  # this disk has room: not a full disk
    assert root_error(_dcp_failure(other)) is other
