"""``flashsale bench --profile DIR``: py-spy on the server under each HTTP row's load.

py-spy samples the server's processes (``--subprocesses``, ``--nonblocking``: the server is not
paused) and writes collapsed stacks (``DIR/<row>.txt``); :func:`summarize` turns them into the
frames with the most own time (leaf samples) and the most inclusive time, the process trunk
(fork, granian's server loop, the CLI) left out; a sample with nothing but the trunk is time
in granian's native runtime. Profiled runs are
slower than unprofiled ones: read their rates as a profile's, not as the benchmark's.
"""

from __future__ import annotations

import re
import shutil
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
    """One row's profile: all ``samples``, the top frames by ``own`` and by ``inclusive`` time."""

    samples: int
    own: list[FrameShare]
    inclusive: list[FrameShare]


class ProfilerMissing(RuntimeError):
    """py-spy is not installed (neither on PATH nor next to this interpreter)."""


def start(pid: int, output: Path, seconds: float) -> subprocess.Popen[bytes]:
    """Sample ``pid`` and its children for ``seconds`` into ``output`` (collapsed stacks).

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
        "--duration",
        str(max(1, int(seconds))),
        "--output",
        str(output),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


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
    total = 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        # The process's trunk (fork, granian's server loop, the CLI) is in every sample: drop it.
        frames = [f for f in frames if not any(t in f for t in _TRUNK) and not f.startswith("<module>")] or [RUNTIME]
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n

    def shares(counter: Counter[str]) -> list[FrameShare]:
        return [FrameShare(frame=f, share=round(n / total, 3)) for f, n in counter.most_common(top)] if total else []

    return ProfileSummary(samples=total, own=shares(own), inclusive=shares(inclusive))


def render(name: str, summary: ProfileSummary) -> str:
    """Plain-text summary of one row's profile."""
    lines = [f"{name}: {summary['samples']} samples"]
    for kind, frames in (("own", summary["own"]), ("inclusive", summary["inclusive"])):
        lines.append(f"  top by {kind} time:")
        lines += [f"    {e['share']:6.1%}  {e['frame']}" for e in frames]
    return "\n".join(lines)
