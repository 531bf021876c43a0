"""``flashsale bench --profile DIR``: py-spy on the server under each HTTP row's load, and on the
consumers while they drain the backlog (first round).

py-spy samples the server's processes (``--subprocesses``, ``--nonblocking``: the server is not
paused) and writes collapsed stacks (``DIR/<row>.txt``); :func:`summarize` turns them into the
frames with the most own time (leaf samples) and the most inclusive time, the process trunk
(fork, granian's server loop, the CLI) left out; a sample with nothing but the trunk is time
in granian's native runtime. It also splits the samples by layer (:func:`layer_of`): each sample
goes to the innermost frame on its stack that belongs to one of the API's own per-request
layers (authentication, request telemetry, the ``before_request`` hook), to Litestar's second
exception-handling layer (the one it wraps around every route once any route middleware
exists), to the rest of our code, to the framework (Litestar, granian's Python side, msgspec),
or else to the native runtime. Profiled runs are
slower than unprofiled ones: read their rates as a profile's, not as the benchmark's.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TypedDict

RATE = 200  # samples per second
_TRUNK = (
    "(multiprocessing/",
    "(server/",
    "(click/",
    "(cli/main.py)",
    "(bench/server.py)",
    "(<frozen runpy>)",
    "(flashsale)",
)
RUNTIME = "(native: granian's Rust runtime, sockets, waiting outside Python frames)"
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


class FrameShare(TypedDict):
    """A frame (``func (dir/file.py)``) and its share of all samples (0-1)."""

    frame: str
    share: float


class ProfileSummary(TypedDict):
    """One row's profile: all ``samples``, the top frames by ``own`` and by ``inclusive`` time,
    and every layer's share (:func:`layer_of`), largest first."""

    samples: int
    own: list[FrameShare]
    inclusive: list[FrameShare]
    layers: list[FrameShare]


LAYERS = (
    (
        "authentication (ours; Litestar's auth middleware while it was one)",
        ("service/api/auth.py", "service/api/token_verifier.py", "litestar/middleware/authentication.py"),
    ),
    ("request telemetry (ours)", ("service/api/request_telemetry.py", "service/metrics.py")),
    ("before_request hook: OPTIONS, media type (ours)", ("service/api/hooks.py", "service/api/media.py")),
)
"""The API's own per-request layers, by the files their frames are in."""
SECOND_EXCEPTION_LAYER = "Litestar's second exception layer (around each route, with route middleware)"
OTHER_OURS = "handler, body and domain (ours), and what they call"
FRAMEWORK = "framework (Litestar, granian's Python side, msgspec)"
_EXCEPTION_MIDDLEWARE = "ExceptionHandlerMiddleware.__call__ ("
_ITS_SEND = "ExceptionHandlerMiddleware.__call__.<locals>.capture_response_started ("
_ROUTE = "HTTPRoute.handle ("
_FRAMEWORK_FILES = ("litestar/", "granian/", "msgspec/")


def layer_of(frames: list[str]) -> str:
    """The layer of one sample (raw ``func (path:line)`` frames, outermost first). Below the route
    (``HTTPRoute.handle``: the hook, the handler, the response and its ``send`` chain), or on
    the whole stack when the route is not on it (the middleware around the route), the innermost
    frame, leaf upwards, that is in one of :data:`LAYERS`, is Litestar's exception middleware
    below another one (or the ``send`` wrapper of that inner one: a response passes the
    innermost one's first), or is other code of ours, names the layer: a framework frame counts
    for the layer that called it, except below the app's own ``send`` wrapper (granian's send,
    the framework's). None: the framework's (the route's own work), or the native runtime when
    no Python frame is on the stack."""
    calls = [i for i, f in enumerate(frames) if f.startswith(_EXCEPTION_MIDDLEWARE)]
    sends = [i for i, f in enumerate(frames) if f.startswith(_ITS_SEND)]
    route = next((i for i, f in enumerate(frames) if f.startswith(_ROUTE)), -1)
    framework = False
    for index in range(len(frames) - 1, route, -1):
        match = _FRAME.match(frames[index].strip())
        if match is None or any(t in _frame(frames[index]) for t in _TRUNK):
            continue
        file = match["file"]
        if index in calls and calls[0] < index:
            return SECOND_EXCEPTION_LAYER
        if index in sends:  # a response goes through the innermost middleware's wrapper first
            return SECOND_EXCEPTION_LAYER if sends.index(index) < len(calls) - 1 else FRAMEWORK
        for name, files in LAYERS:
            if file.startswith(files):
                return name
        if file.startswith(("service/", "toolkit/bench/product_app.py")) and not file.startswith(
            "service/api/serving.py"
        ):
            return OTHER_OURS
        framework = framework or file.startswith(_FRAMEWORK_FILES)
    return FRAMEWORK if framework or route >= 0 else RUNTIME


class ProfilerMissing(RuntimeError):
    """py-spy is not installed (neither on PATH nor next to this interpreter)."""


def start(pid: int, output: Path, seconds: float | None) -> subprocess.Popen[bytes]:
    """Sample ``pid`` and its children for ``seconds`` (None: until :func:`stop`) into ``output``
    (collapsed stacks).

    Raises:
        ProfilerMissing: no py-spy on PATH.
    """
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        raise ProfilerMissing("py-spy not found on PATH: pip install py-spy")
    argv = [
        spy,
        "record",
        "--pid",
        str(pid),
        "--subprocesses",
        "--nonblocking",
        "--format",
        "raw",
        "--rate",
        str(RATE),
        *(["--duration", str(max(1, int(seconds)))] if seconds is not None else []),
        "--output",
        str(output),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def stop(spy: subprocess.Popen[bytes]) -> None:
    """End a py-spy started without a duration: on SIGINT it writes what it sampled and exits."""
    spy.send_signal(signal.SIGINT)
    spy.wait()


def _frame(raw: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (to/file.py)``: line numbers merged."""
    match = _FRAME.match(raw.strip())
    if match is None:
        return raw.strip()
    path = "/".join(match["file"].split("/")[-2:])
    return f"{match['func']} ({path})"


def summarize(stacks: Path, top: int = 10) -> ProfileSummary:
    """Top ``top`` frames by own samples and by inclusive samples, as shares of all samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        raw = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        layers[layer_of(raw)] += int(count)
        frames = [_frame(f) for f in raw]
        # The process's trunk (fork, granian's server loop, the CLI) is in every sample: drop it.
        frames = [f for f in frames if not any(t in f for t in _TRUNK) and not f.startswith("<module>")] or [RUNTIME]
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n

    def shares(counter: Counter[str], most: int = top) -> list[FrameShare]:
        return [FrameShare(frame=f, share=round(n / total, 3)) for f, n in counter.most_common(most)] if total else []

    every_layer = shares(layers, len(layers))
    return ProfileSummary(samples=total, own=shares(own), inclusive=shares(inclusive), layers=every_layer)


def render(name: str, summary: ProfileSummary) -> str:
    """Plain-text summary of one row's profile."""
    lines = [f"{name}: {summary['samples']} samples"]
    for kind, frames in (("own", summary["own"]), ("inclusive", summary["inclusive"])):
        lines.append(f"  top by {kind} time:")
        lines += [f"    {e['share']:6.1%}  {e['frame']}" for e in frames]
    lines.append("  by layer (innermost layer frame of each sample):")
    lines += [f"    {e['share']:6.1%}  {e['frame']}" for e in summary["layers"]]
    return "\n".join(lines)
