"""Experiment tracking: config and metrics to trackio, from the main process.

trackio is local-first: each project is a SQLite file under ``$TRACKIO_DIR`` (default
``$HF_HOME/trackio``), viewed with ``trackio show``. We never give it a Space or server,
so a run logs offline; only a user who exports ``TRACKIO_SPACE_ID``/``TRACKIO_SERVER_URL``
opts into trackio's remote mode. trackio is an optional extra, imported only when
``--trackio.enable=true``; every other rank gets the no-op tracker, so a multi-process
job is one trackio run.

trackio writes in a thread of its own and carries on when its storage refuses a write
(a read-only or full ``$TRACKIO_DIR``), warning with a two-line Python warning per
batch. The tracker turns the first of those into one ``warning:`` line naming the path
and errno and hides the repeats: the run goes on, ``logs/metrics.jsonl`` holds every
logged row, and trackio's own records simply stop.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import re
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from lerobot_kit.core.distributed.process_group import DistContext, broadcast_object
from lerobot_kit.core.errors import ConfigError

if TYPE_CHECKING:
    from lerobot_kit.core.run.spec import RunSpec

logger = logging.getLogger("lerobot_kit")

# Env vars with which trackio sends runs to a Space or self-hosted server instead of disk.
_REMOTE_ENV = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")
# How trackio's warning quotes the OSError of a write its storage refused.
_STORAGE_REFUSED = re.compile(r"failed to flush .*\[Errno (\d+)\] ([^:']+): '([^']*)'")


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


class NullTracker:
    """Tracking disabled, or not the main process."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


class TrackioTracker:
    def __init__(self, trackio: Any) -> None:
        self._trackio = trackio
        self._storage_warned = False
        self._previous_showwarning = warnings.showwarning
        warnings.showwarning = self._show_warning

    @classmethod
    def start(cls, spec: RunSpec) -> TrackioTracker:
        """Create the trackio run, with the whole config attached (trackio stores it once,
        with the run's first metrics). Raises ConfigError when trackio is missing or refuses."""
        trackio = _import_trackio()
        config = spec.config
        project = config.trackio.project
        name = config.job_name or spec.output_dir.name
        try:
            # trackio prints a banner of its own on stdout; one log line below says the same.
            with _hub_offline_unless_remote(), contextlib.redirect_stdout(io.StringIO()):
                trackio.init(
                    project=project,
                    name=name,
                    config=spec.recorded_config(),
                    # A resumed training run continues its trackio run instead of starting a twin.
                    resume="allow" if spec.resuming else "never",
                    embed=False,
                )
        except Exception as exc:  # trackio validates names and opens its database here
            raise ConfigError(
                f"--trackio.project={project}: trackio could not start run {name!r} ({type(exc).__name__}: {exc}); "
                "check the project name and $TRACKIO_DIR, or pass --trackio.enable=false"
            ) from exc
        location = os.environ.get(_REMOTE_ENV[0]) or os.environ.get(_REMOTE_ENV[1]) or trackio.utils.TRACKIO_DIR
        logger.info(f"trackio: project {project} | run {name} | {location} (view: trackio show --project {project})")
        return cls(trackio)

    def log(self, metrics: dict[str, float], step: int) -> None:
        # "step" is trackio's own axis (a reserved metric name), passed as the step instead.
        self._trackio.log({k: v for k, v in metrics.items() if k != "step"}, step=step)

    def finish(self) -> None:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                self._trackio.finish()
        finally:
            warnings.showwarning = self._previous_showwarning

    def _show_warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
        """trackio's warning that its storage refused a write: one line, the first time; others as usual."""
        refused = _STORAGE_REFUSED.search(str(message)) if "trackio" in filename else None
        if refused is None:
            self._previous_showwarning(message, category, filename, lineno, file, line)
            return
        if not self._storage_warned:
            self._storage_warned = True
            code = int(refused.group(1))
            logger.warning(
                f"warning: trackio could not store the metrics: {refused.group(3)}: {refused.group(2)} "
                f"(errno {errno.errorcode.get(code, code)}); the run goes on, and logs/metrics.jsonl has every row"
            )


def make_tracker(spec: RunSpec, ctx: DistContext) -> Tracker:
    """A trackio tracker on the main process when enabled, else a no-op one.

    Collective when enabled: every rank raises the main process's ConfigError, so a
    refused start ends the whole job at once instead of leaving peers in a collective.
    """
    if not spec.config.trackio.enable:
        return NullTracker()
    tracker: Tracker = NullTracker()
    failure: ConfigError | None = None
    if ctx.is_main:
        try:
            tracker = TrackioTracker.start(spec)
        except ConfigError as exc:
            failure = exc
    failure = broadcast_object(ctx, failure)
    if failure is not None:
        raise failure
    return tracker


def _import_trackio() -> Any:
    try:
        import trackio
    except ImportError as exc:
        raise ConfigError(
            "--trackio.enable=true needs trackio: pip install 'lerobot-kit[trackio]' (or pass --trackio.enable=false)"
        ) from exc
    return trackio


@contextlib.contextmanager
def _hub_offline_unless_remote() -> Iterator[None]:
    """Keep trackio's local start off the network.

    With a Hugging Face token present, ``trackio.init`` asks the Hub who the user is
    (``whoami``), only to label the run; offline, or behind a firewall that drops
    packets, that request fails or stalls the start. huggingface_hub's offline switch
    makes it fail at once, locally. Left alone when the user opted into a remote trackio.
    """
    if any(os.environ.get(name) for name in _REMOTE_ENV):
        yield
        return
    from huggingface_hub import constants

    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous
