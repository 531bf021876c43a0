"""Availability in a fault row: how much of the sale the buyers were answered 503, for how long
in one stretch, and whether that stretch is within what the fault itself explains
(docs/RELIABILITY.md, "Method").

Every try of a buyer is recorded with the connection it went over (its local port): an HTTP/1.1
connection is accepted by one API worker and served by it until it closes, so a run of 503s on
one connection is a stretch in which that worker answered 503 (the harness cannot tell the workers
apart otherwise, and needs not: a worker whose every answer is 503 shows up on each of its
connections, while the sale as a whole may still be served by the other worker).

- ``share``: tries answered 503, of all tries;
- ``longest_worker``: the longest run of 503s on one connection, first to last, in seconds;
- ``longest_all``: the longest stretch in which every try, over every connection, was a 503.

**The bound.** A row fails when ``longest_worker`` exceeds the fault's own recovery plus
:data:`SLACK`. The fault's own recovery is what the failed part needs before it can serve again:
for a server that is killed and started again, the whole fault (from ``faulted()`` to
``fault_over()``, when it answers again); for a fault that the deployment rides out by itself
(a quorum queue electing a new leader, a replica promoted), the row states it as
``FaultSale.recovery`` (seconds from the fault's start, as that part's own documentation or a
measurement gives it). A fault that takes no store away (a worker or a consumer killed, poison)
has a recovery of 0: any 503 stretch beyond :data:`SLACK` is the service's own doing.

**The log.** Every 503 stretch must have its cause logged while it lasts (the API's
``unavailable_answered`` line, at most one a second per cause, or ``store_unavailable``):
:func:`silent_windows`.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import httpx

SLACK = 3.0
"""Seconds a 503 stretch may outlast the fault's own recovery (the issue's bound)."""
LOG_SLACK = 1.5
"""Seconds around a 503 stretch in which its log line may fall (one line a second per cause, and
the line of the stretch's first 503 may come from a second earlier)."""
LOGGED_EVENTS = ("unavailable_answered", "store_unavailable")


class Try(Protocol):
    at: float  # monotonic seconds, when the answer came
    status: int
    connection: int


@dataclass(frozen=True)
class Window:
    start: float  # monotonic seconds
    end: float
    connection: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Availability:
    share: float  # of the tries, answered 503
    longest_worker: float  # seconds
    longest_all: float  # seconds
    windows: tuple[Window, ...]  # per connection

    def details(self) -> dict[str, float | int]:
        return {
            "share_503": round(self.share, 3),
            "longest_503_window_one_worker": round(self.longest_worker, 1),
            "longest_503_window_all_workers": round(self.longest_all, 1),
            "windows_503": len(self.windows),
        }


def connection_of(response: httpx.Response) -> int:
    """The local port of the connection ``response`` came over (0 when httpx does not say; the
    stream's identity when the connection is already closed)."""
    stream = response.extensions.get("network_stream")
    if stream is None:
        return 0
    try:
        address = stream.get_extra_info("client_addr")
    except OSError:  # the server closed it with this response: still one connection, one worker
        return id(stream)
    return int(address[1]) if address else 0


def measure(tries: Sequence[Try]) -> Availability:
    """The availability of the sale from the buyers' ``tries`` (every answer, final or not; a try
    that got no answer belongs to no connection and ends no stretch)."""
    answered = sorted((t for t in tries if t.status), key=lambda t: t.at)
    by_connection: dict[int, list[Try]] = defaultdict(list)
    for one in answered:
        if one.connection:
            by_connection[one.connection].append(one)
    windows = [window for connection, own in by_connection.items() for window in _runs(own, connection)]
    everyone = list(_runs(answered, 0))
    share = sum(1 for t in answered if t.status == 503) / len(answered) if answered else 0.0
    return Availability(
        share,
        max((w.seconds for w in windows), default=0.0),
        max((w.seconds for w in everyone), default=0.0),
        tuple(windows),
    )


def _runs(tries: Iterable[Try], connection: int) -> Iterable[Window]:
    start: float | None = None
    last = 0.0
    for one in tries:
        if one.status == 503:
            start = one.at if start is None else start
            last = one.at
        elif start is not None:
            yield Window(start, last, connection)
            start = None
    if start is not None:
        yield Window(start, last, connection)


def verdict(availability: Availability, own_recovery: float) -> str | None:
    """The failed check when a worker answered 503 longer than ``own_recovery`` + :data:`SLACK`."""
    bound = own_recovery + SLACK
    if availability.longest_worker > bound:
        return (
            f"an API worker answered 503 for {availability.longest_worker:.1f}s"
            f" (bound {bound:.1f}s: the fault's own recovery {own_recovery:.1f}s + {SLACK:.0f}s)"
        )
    return None


def silent_windows(windows: Iterable[Window], api_log: str) -> list[Window]:
    """The 503 stretches during which the API logged no cause (:data:`LOGGED_EVENTS`)."""
    to_wall = time.time() - time.monotonic()
    told: list[float] = []
    for line in api_log.splitlines():
        if not line.startswith("{") or not any(event in line for event in LOGGED_EVENTS):
            continue
        try:
            entry = json.loads(line)
            told.append(datetime.fromisoformat(entry["timestamp"]).timestamp())
        except (ValueError, KeyError):
            continue
    told.sort()
    silent = []
    for window in windows:
        start, end = window.start + to_wall - LOG_SLACK, window.end + to_wall + LOG_SLACK
        if not any(start <= at <= end for at in told):
            silent.append(window)
    return silent
