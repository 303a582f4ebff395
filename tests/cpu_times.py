"""``pytest --cpu-times=FILE``: the CPU seconds each test cost, its own processes included.

On a shared machine a test's wall time says more about the neighbours than about the
test; its CPU time (user + system, of the test worker and of every process it started
and waited for) barely moves with load. Each test's phases are charged to it, a module
fixture to the test that first needed it. Workers attach the figures to their reports,
so under pytest-xdist the controller sums them; it writes FILE as JSON (per test, per
file, total) and prints the costliest files.
"""

from __future__ import annotations

import json
import resource
import sys
from collections import defaultdict
from pathlib import Path

import pytest

_KEY = "cpu_s"
_MARK = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """User + system time of this process, of its children that have been waited for, and
    of the rank pools' processes still running (``rank_pool.py``: they report their own)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    pools = sys.modules.get("rank_pool")
    running = pools.unwaited_cpu_seconds() if pools is not None else 0.0
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + running


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-times", metavar="FILE", default=None,
                     help="write the CPU seconds of each test (its processes included) to FILE as JSON")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    item.stash[_MARK] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if item.config.getoption("--cpu-times") and _MARK in item.stash:
        now = _cpu_seconds()
        report.user_properties.append((_KEY, now - item.stash[_MARK]))
        item.stash[_MARK] = now
    return report


class _Tally:
    """On the controller (or the only process): the sums, and the file at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.per_test: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == _KEY:
                self.per_test[report.nodeid] += float(value)

    def pytest_sessionfinish(self) -> None:
        per_file: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.per_test.items():
            per_file[nodeid.split("::")[0]] += seconds
        total = sum(per_file.values())
        self.path.write_text(json.dumps({
            "total_cpu_s": round(total, 1),
            "per_file": {f: round(s, 1) for f, s in sorted(per_file.items(), key=lambda kv: -kv[1])},
            "per_test": {t: round(s, 2) for t, s in sorted(self.per_test.items(), key=lambda kv: -kv[1])},
        }, indent=1))
        self.total, self.per_file = total, per_file

    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.section("CPU seconds (tests and the processes they started)")
        for name, seconds in sorted(self.per_file.items(), key=lambda kv: -kv[1])[:15]:
            terminalreporter.write_line(f"{seconds:8.1f}  {name}")
        terminalreporter.write_line(f"{self.total:8.1f}  total, in {len(self.per_test)} tests -> {self.path}")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--cpu-times")
    if path and not hasattr(config, "workerinput"):  # an xdist worker reports to the controller
        config.pluginmanager.register(_Tally(Path(path)), "cpu_times_tally")
