"""Video features: frames decoded on demand from ``videos/<key>/chunk-*/file-*.mp4`` with PyAV.

A v3.0 video file concatenates many episodes; an episode's frame with timestamp ``t``
(the ``timestamp`` column) is the video frame shown at ``from_timestamp + t``, where
``from_timestamp`` comes from the episode's row in ``meta/episodes``. A query is served
as LeRobot's PyAV reader serves it — seek to a key frame before the first wanted
time, decode forward until a frame at or past the last one, take the nearest frame to
each query, convert it with ``to_ndarray(format="rgb24")`` — so the pixels are the
same (the seek lands on the key frame at or before the first wanted frame, which LeRobot
passes when that frame is a key frame itself: the same pixels, one GOP less decoded).
A frame further than ``TOLERANCE_FRAMES`` frame periods from its query is an error (the
video and the data disagree), never a silent nearest-neighbour guess.

Each process (a DataLoader worker) keeps a bounded pool of open decoders, one per
file, shared by every dataset it reads (``open_files``): however many datasets a run
mixes, a process holds at most ``MAX_OPEN_DECODERS`` files open for video (three quarters
of its open-file limit), and decoders of at most ``DECODER_MEMORY`` bytes (estimated from
their frame size: ``decoder_bytes``). Each file is opened as mp4, LeRobot's container,
without probing its format first (a sixth of an open's cost). A decoder
that stopped shortly before the wanted time (closer than a seek has been costing, in
frames) decodes forward instead of seeking, so reading consecutive frames decodes each
frame once; the frames it last handed out are
kept as RGB, so history windows that overlap (frame ``t`` in item ``t`` and ``t+1``)
are not decoded or converted twice. LeRobot encodes with a key frame every 2 frames, so a seek costs at most
one extra frame; long GOPs stay correct, only slower.

No open decoder crosses a fork. FFmpeg keeps thread pools (the RGB converter's among
them) whose threads a forked child does not inherit; a child that frees a decoder it
inherited waits for them forever — a DataLoader worker forked after the training process
measured camera stats would deadlock on its first item. So every open decoder of a
process is closed just before it forks (``os.register_at_fork``) and reopened on its
next request; each child opens its own, as a worker started by spawn does (a dataset
pickles without decoders). Workers stay forked: spawning them would import torch again in each.

PyAV (``pip install 'lerobot-kit[video]'``) is the only decoder: it ships its own
FFmpeg with AV1 (LeRobot's default codec) and H.264 decoders.
"""

from __future__ import annotations

import bisect
import collections
import os
import threading
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from lerobot_kit.api import ConfigError
from lerobot_kit.plugins.datasets.lerobot.files import LeRobotDatasetError
from lerobot_kit.plugins.datasets.lerobot.open_files import DECODER_SHARE, FileBudget, OpenFiles

VIDEO_EXTRA = "pip install 'lerobot-kit[video]' (or: pip install av)"
BACKENDS = ("pyav",)
TOLERANCE_FRAMES = 0.4
FRAME_FORMATS = {1: "gray", 3: "rgb24"}
# Files per process, all datasets together: three quarters of the open-file limit (768 of the usual 1024).
MAX_OPEN_DECODERS = FileBudget(DECODER_SHARE)
# Estimated memory of the open decoders per process: about 125 of 480×640, 650 of 96×96 (``decoder_bytes``).
# A mixture whose camera files outnumber them closes and reopens decoders, and opening one
# (about 0.3 ms, and its first frames slower) costs a third of a 480×640 frame's decode.
DECODER_MEMORY = 384 << 20
# The most recently used decoders, never closed to make room: as many as the cameras a
# request reads at once (``camera_threads``).
KEPT_DECODERS = 8


def require_video_decoder(backend: str | None, video_keys: list[str]) -> ModuleType:
    """The ``av`` module, or an error naming the extra that provides it."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(
            f"--dataset.video_backend={backend} is not supported; supported: {', '.join(BACKENDS)} "
            "(or leave it unset)"
        )
    try:
        import av
    except ImportError as exc:
        raise LeRobotDatasetError(
            f"this dataset stores {video_keys} as video (dtype 'video' in meta/info.json); decoding needs PyAV: "
            f"{VIDEO_EXTRA}"
        ) from exc
    return av


def check_channels(info_file: Path, key: str, shape: tuple[int, ...]) -> None:
    if shape[0] not in FRAME_FORMATS:
        raise LeRobotDatasetError(
            f"{info_file}: video feature {key!r} has {shape[0]} channels; supported: {sorted(FRAME_FORMATS)}"
        )


class _Decoder:
    """One open video file: its demuxer, a live decode position, and the frames it last handed out.

    Only frames some item asked for are converted to RGB and kept (``converted``, the
    last ``keep`` of them, channel-last as converted); every other decoded frame is
    dropped at once. Holding on to
    decoded frames would starve the decoder's buffer pool: it would allocate fresh
    buffers for every frame, several times slower than decoding itself.
    """

    def __init__(self, av: ModuleType, path: Path, keep: int) -> None:
        self.path = path
        self.container = av.open(str(path), format="mp4" if path.suffix == ".mp4" else None)
        self.stream = self.container.streams.video[0]
        # Workers decode in parallel, one thread each; more threads only add frame buffers.
        self.stream.codec_context.thread_count = 1
        self.time_base = self.stream.time_base
        # ``pts * numerator / denominator`` in integers, then one division: the float nearest the
        # exact time, as ``float(pts * time_base)`` gives it, without Fraction arithmetic per frame.
        self.tick = (self.time_base.numerator, self.time_base.denominator)
        # Frames lie on whole ticks of the time base, so none is nearer to a time than a frame
        # within half a tick of it, or past it: decoding stops there. (A query's time, the
        # float32 timestamp column plus the episode's offset, often lies a hair past its
        # frame; stopping only past it, as LeRobot does, decodes the next frame for nothing:
        # after an odd frame of a GOP-2 video, a key frame.)
        self.half_tick = float(self.time_base) / 2
        self.reordered = bool(self.stream.codec_context.has_b_frames)
        self.frames: Any = None  # the decode iterator since the last seek
        self.position = -np.inf  # time of the last decoded frame
        self.last: tuple[float, Any] | None = None  # that frame: the next item often wants it
        self.converted: collections.OrderedDict[float, np.ndarray] = collections.OrderedDict()
        self.keep = keep
        self.seen: collections.deque[float] = collections.deque(maxlen=4)  # last decoded times, for errors
        self.decoded = 0  # frames decoded so far
        # Frames a seek costs before the wanted one (a running mean; LeRobot's GOP 2: 0 or 1):
        # decoding forward is cheaper than seeking for anything closer than that.
        self.seek_cost = 1.0

    def seek(self, time: float) -> None:
        """To the key frame at or before ``time``: its frame and every later one decode as they
        would from any earlier key frame. LeRobot seeks one time-base tick earlier, which on
        its GOP-2 videos lands a whole GOP before a key frame that is wanted itself (2.5 frames
        decoded per query instead of 1.5). That margin is kept where frames are reordered
        (B-frames): a key frame's decode time, by which the demuxer seeks, then precedes its
        presentation time."""
        margin = 1 if self.reordered else 0
        self.container.seek(round(time / self.time_base) - margin, backward=True, any_frame=False, stream=self.stream)
        self.frames = self.container.decode(self.stream)
        self.position = -np.inf
        self.last = None

    def next(self) -> tuple[float, Any] | None:
        """The next decoded frame and its presentation time, or None at the end of the stream."""
        if self.frames is None:
            return None
        for frame in self.frames:
            if frame.pts is None:
                continue
            self.decoded += 1
            self.position = frame.pts * self.tick[0] / self.tick[1]
            self.seen.append(self.position)
            self.last = (self.position, frame)
            return self.last
        self.frames = None
        return None

    def remember(self, time: float, pixels: np.ndarray) -> None:
        self.converted[time] = pixels
        self.converted.move_to_end(time)
        while len(self.converted) > self.keep:
            self.converted.popitem(last=False)

    def close(self) -> None:
        self.converted.clear()
        self.last = None
        self.container.close()


# This process's open decoders.
_OPEN: OpenFiles[_Decoder] = OpenFiles(MAX_OPEN_DECODERS, _Decoder.close, max_cost=DECODER_MEMORY,
                                       kept=KEPT_DECODERS)
os.register_at_fork(before=_OPEN.close_all)


class VideoDecoders:
    """One dataset's video reader: its decoders live in the process's shared pool, keyed by
    this reader and the file, so a dataset opened twice never sees the other's decoders.

    ``keep`` is how many converted frames each decoder remembers: the span of the
    longest camera history asked for, so overlapping windows of consecutive items
    convert each frame once. Holds no decoder itself, so it pickles without FFmpeg
    state, which cannot cross processes (a DataLoader worker opens its own).
    """

    def __init__(self, av: ModuleType, fps: int, keep: int = 1) -> None:
        self.av = av
        self.fps = fps
        self.tolerance = TOLERANCE_FRAMES / fps
        self.keep = max(1, keep)
        self._owner = uuid.uuid4().hex  # unique across processes, as a pickled copy's must stay

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "av": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        import av

        self.av = av

    def frames(
        self, path: Path, key: str, episodes: list[int], times: np.ndarray, shape: tuple[int, ...]
    ) -> list[np.ndarray]:
        """uint8 ``[H, W, C]`` arrays, as converted: the frame of ``path`` nearest to each time
        (``episodes[k]``: the episode ``times[k]`` belongs to, named in errors).

        Not copied into one channel-first array: transposing a frame costs a worker about
        as much CPU as decoding it, and a copy more than a tenth of that. The reader views
        them channel-first (``channels_first``), and collation stacks them with plain
        copies into a ``channels_last`` batch (``core.data.loader.collate``); frames a
        decoder remembers may be handed out again, so they are never written to.
        """
        wanted = np.array(sorted(set(times.tolist())))  # np.unique's dispatch costs more for a request's few times

        def episode_at(time: float) -> int:
            return episodes[int(np.argmin(np.abs(times - time)))]

        try:
            found: dict[float, np.ndarray] = {}
            for run in self._runs(path, wanted):
                found.update(self._decode(path, key, run, shape))
        except LeRobotDatasetError:
            raise
        except FileNotFoundError as exc:
            raise LeRobotDatasetError(
                f"{path}: missing; it holds video {key!r} of episode {episodes[0]}. The dataset is incomplete"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - FFmpeg errors come in many types
            self._forget(path)
            raise LeRobotDatasetError(
                f"{path}: cannot decode video {key!r} at {wanted[0]:.4f}s (episode {episode_at(wanted[0])}): "
                f"{type(exc).__name__}: {exc}; the file is damaged: re-copy or re-download the dataset"
            ) from exc
        for time in wanted:
            if float(time) not in found:
                raise LeRobotDatasetError(
                    f"{path}: episode {episode_at(time)} needs the frame at {time:.4f}s of {key!r} but the video has "
                    f"{self._nearest_text(path, float(time))}; the video does not match meta/episodes "
                    "(from_timestamp) and the timestamp column"
                )
        return [found[time] for time in times.tolist()]

    def _runs(self, path: Path, wanted: np.ndarray) -> list[np.ndarray]:
        """``wanted`` (sorted) cut where the next time is further ahead than a seek costs: each
        run is decoded forward, and the frames between two runs are skipped by a seek."""
        if len(wanted) == 1:
            return [wanted]
        decoder = _OPEN.peek((self._owner, path))
        gap = ((decoder.seek_cost if decoder is not None else 1.0) + 1) / self.fps
        return np.split(wanted, np.flatnonzero(np.diff(wanted) > gap) + 1)

    def _decode(self, path: Path, key: str, wanted: np.ndarray, shape: tuple[int, ...]) -> dict[float, np.ndarray]:
        """The frame nearest to each wanted time (sorted) within tolerance, decoding as little as it can.

        A decoder reused from an earlier request may have passed a wanted frame it did not
        keep; then the request is served again from a seek.
        """
        decoder, seeked = self._decoder_for(path, float(wanted[0]), shape)
        if not seeked:
            found = self._collect(decoder, key, wanted, shape)
            if len(found) == len(wanted):
                return found
            decoder.seek(float(wanted[0]))
        before = decoder.decoded
        found = self._collect(decoder, key, wanted, shape)
        span = (float(wanted[-1]) - float(wanted[0])) * self.fps  # frames the request needs anyway
        decoder.seek_cost = 0.8 * decoder.seek_cost + 0.2 * max(0.0, decoder.decoded - before - 1 - span)
        return found

    def _collect(
        self, decoder: _Decoder, key: str, wanted: np.ndarray, shape: tuple[int, ...]
    ) -> dict[float, np.ndarray]:
        best: dict[float, tuple[float, Any]] = {}  # query -> (time, converted array or decoded frame)
        queries: list[float] = wanted.tolist()

        def offer(time: float, frame: Any) -> None:
            for j in _within(queries, time, self.tolerance):
                query = queries[j]
                if query not in best or abs(time - query) < abs(best[query][0] - query):
                    best[query] = (time, frame)

        for time, pixels in decoder.converted.items():
            offer(time, pixels)
        if decoder.last is not None:
            offer(*decoder.last)
        last = queries[-1] - decoder.half_tick
        while decoder.position < last:
            decoded = decoder.next()
            if decoded is None:
                break
            offer(*decoded)
        out = {}
        for query, (time, candidate) in best.items():
            pixels = candidate if isinstance(candidate, np.ndarray) else decoder.converted.get(time)
            if pixels is None:
                pixels = _to_array(decoder, key, candidate, shape)
            decoder.remember(time, pixels)
            out[query] = pixels
        return out

    def _decoder_for(self, path: Path, first: float, shape: tuple[int, ...]) -> tuple[_Decoder, bool]:
        """The decoder of ``path``, as it stands when it holds ``first`` or reaches it by decoding
        forward, else seeked to it (and True). Opening a file costs more than seeking in it,
        so each file has one decoder; the process's least recently used ones are closed past
        ``MAX_OPEN_DECODERS`` or ``DECODER_MEMORY``."""
        decoder = _OPEN.get((self._owner, path), lambda: _Decoder(self.av, path, self.keep),
                            cost=decoder_bytes(shape, self.keep))
        ahead = (first - decoder.position) * self.fps
        held = any(abs(time - first) <= self.tolerance for time in [*decoder.converted, decoder.position])
        if held or (decoder.frames is not None and 0 < ahead <= decoder.seek_cost + 1):
            return decoder, False
        decoder.seek(first)
        return decoder, True

    def _forget(self, path: Path) -> None:
        _OPEN.discard((self._owner, path))

    def _nearest_text(self, path: Path, time: float) -> str:
        decoder = _OPEN.peek((self._owner, path))
        seen = [*decoder.seen, *decoder.converted] if decoder is not None else []
        if not seen:
            return "no frames near it"
        nearest = min(seen, key=lambda t: abs(t - time))
        return f"nearest frame at {nearest:.4f}s"



def decoder_bytes(shape: tuple[int, ...], keep: int) -> int:
    """Estimated memory of an open decoder of ``[C, H, W]`` frames: its fixed state (about
    0.5 MB) and pictures (about 3.5 frames in 4:2:0), as measured of PyAV's AV1 decoder
    mid-stream (2.0 MB at 480×640, 0.52 MB at 96×96), and the ``keep`` converted frames it
    remembers."""
    channels, height, width = shape
    return (512 << 10) + 7 * height * width * 3 // 4 + keep * channels * height * width


def _within(sorted_times: list[float], time: float, tolerance: float) -> range:
    """Indices of the sorted times within ``tolerance`` of ``time`` (bisect: a request holds a
    few times, for which NumPy's calls cost more than the search)."""
    lo = bisect.bisect_left(sorted_times, time - tolerance)
    return range(lo, bisect.bisect_right(sorted_times, time + tolerance))


class _Converter(threading.local):
    """A thread's one frame converter (an FFmpeg swscale context, which two threads cannot
    share), used for every frame of every file, as ``frame.to_ndarray(format=...)`` would
    convert it, pixel for pixel.

    ``to_ndarray(format=...)`` sets up a converter for each frame, and since PyAV 17 a pool
    of threads for it: that costs more than converting a small frame (ten times more at
    32×32, as much at 480×640). One thread, as the decoders: workers convert in parallel.
    The forking thread's is dropped before a fork with the decoders (a converter of one
    thread has no threads of its own to lose).
    """

    def __init__(self) -> None:
        self._reformatter: Any = None
        self._options: dict[str, int] = {}

    def to_ndarray(self, frame: Any, format: str) -> np.ndarray:
        if self._reformatter is None:
            import av
            from av.video.reformatter import VideoReformatter

            self._reformatter = VideoReformatter()
            self._options = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}
        return self._reformatter.reformat(frame, format=format, **self._options).to_ndarray()

    def close(self) -> None:
        self._reformatter = None


_CONVERTER = _Converter()
os.register_at_fork(before=_CONVERTER.close)


def _to_array(decoder: _Decoder, key: str, frame: Any, shape: tuple[int, ...]) -> np.ndarray:
    """uint8 ``[H, W, C]`` of a decoded frame, converted as LeRobot's PyAV reader converts it."""
    channels, height, width = shape
    pixels = _CONVERTER.to_ndarray(frame, FRAME_FORMATS[channels])
    pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], -1)
    if pixels.shape != (height, width, channels):
        raise LeRobotDatasetError(
            f"{decoder.path}: frames of {key!r} are {pixels.shape[1]}x{pixels.shape[0]}; "
            f"meta/info.json declares {width}x{height}"
        )
    return pixels
