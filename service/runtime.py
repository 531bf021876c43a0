"""Process life for the long-running commands: stop on SIGTERM/SIGINT, repeat a pass with
``--watch``, wait out an outage with back-off (:class:`Backoff`) and say so once per outage
(:class:`OutageLog`), not once per attempt (:func:`when_reachable`, the one such wait); stop a
background task for sure (:func:`stop_task`); keep what start-up built out of the cyclic garbage
collector's passes (:func:`freeze_startup_heap`)."""

from __future__ import annotations

import asyncio
import gc
import random
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import structlog

from service.failures import is_outage, outage_of

T = TypeVar("T")
log = structlog.get_logger(__name__)

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive (modules, the app, pools, caches) to the
    permanent generation (``gc.freeze``, Python 3.7+), where the cyclic collector never looks
    again. Call it when a long-running process has finished starting. Without it each full
    collection walked the whole start-up heap: in an API worker under load, 18 of them in a
    20 s run cost 1.7 s (95 ms each, the product no-op's p99) against 0.13 s after the freeze
    (docs/BENCHMARKS.md). What start-up built and later drops is freed by reference counting
    as before; only a reference cycle among frozen objects stays."""
    gc.collect()
    gc.freeze()


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop (the asyncio loop where uvloop is missing); returns its result.
    Only the import of uvloop is guarded: an ImportError raised by the coroutine itself
    propagates (it used to run the coroutine a second time)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.run(coro)
    return uvloop.run(coro)


@contextmanager
def stop_signal() -> Iterator[asyncio.Event]:
    """An event that SIGTERM or SIGINT sets while inside the block (handlers removed on exit).
    Call from inside the running event loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)


class Backoff:
    """Delays between attempts: ``first`` seconds, doubling up to ``cap``, each with +-20 %
    jitter (processes that lost the same store do not retry in step); :meth:`reset` after a
    success starts again from ``first``."""

    def __init__(self, first: float = 0.5, cap: float = 5.0) -> None:
        self._first = first
        self._cap = max(cap, first)
        self._next = first

    def next(self) -> float:
        """The delay before the next attempt (and double the one after, up to the cap)."""
        delay = self._next
        self._next = min(self._next * 2, self._cap)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self._first


class OutageLog:
    """One log line when a run of failures starts (``<event>_failing``, the first error) and one
    when it ends (``<event>_recovered``: failures in the run, seconds); the failures between
    write nothing. ``fields`` go on both lines. For loops that retry while a store is away: a
    10-minute outage is two lines, not one per attempt."""

    def __init__(self, event: str, **fields: object) -> None:
        self._event = event
        self._fields = fields
        self.failures = 0
        self._since = 0.0

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException, **fields: object) -> None:
        """One more failure; the first of a run is logged (warning) with ``exc`` in one line."""
        if self.failures == 0:
            self._since = time.monotonic()
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            log.warning(f"{self._event}_failing", error=error, **self._fields, **fields)
        self.failures += 1

    def recovered(self, **fields: object) -> None:
        """A success: ends the run of failures (logged when there was one)."""
        if self.failures:
            seconds = round(time.monotonic() - self._since, 1)
            log.warning(f"{self._event}_recovered", failures=self.failures, seconds=seconds, **self._fields, **fields)
        self.failures = 0


async def when_reachable(
    attempt: Callable[[], Awaitable[T]],
    stop: asyncio.Event | None = None,
    *,
    backoff: Backoff | None = None,
    waiting: OutageLog | None = None,
    survive: Callable[[BaseException], bool] = is_outage,
) -> T | None:
    """``await attempt()``, tried again while it fails with an error ``survive`` accepts (a store
    that is away, :func:`service.failures.is_outage`), with back-off (``backoff``: 0.5 s doubling
    to 5 s by default) and one log line when the wait begins and one when it ends, however long
    it takes (``waiting``: a ``dependency`` :class:`OutageLog` by default). Its result, or None
    when ``stop`` was set first. The one wait of every long-running command.

    Raises:
        Whatever ``attempt`` raises that ``survive`` refuses.
    """
    backoff = backoff or Backoff()
    waiting = waiting or OutageLog("dependency")
    while True:
        try:
            result = await attempt()
        except Exception as exc:
            if not survive(exc):
                raise
            waiting.failed(exc, store=outage_of(exc) or "unknown")
            if await wait_or_stop(stop, backoff.next()):
                return None
            continue
        waiting.recovered()
        return result


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended; an exception it ended with (other than the
    cancellation) is raised here.

    Cancels again every 0.1 s while the task still runs: on Python 3.11, ``asyncio.wait_for``,
    which redis-py awaits around every command it sends, drops a cancellation that arrives just
    as the awaited operation completes (CPython gh-86296, fixed in 3.12). A loop task that lost
    its one cancellation ran on forever and held its process's shutdown (seen in the recovery
    task: a worker that never exits).
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.cancelled():
        error = task.exception()
        if error is not None:
            raise error


async def wait_or_stop(stop: asyncio.Event | None, seconds: float) -> bool:
    """Sleep ``seconds``, cut short by ``stop``; True when ``stop`` is set."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def watch(
    seconds: float | None,
    one_pass: Callable[[], Awaitable[object]],
    *,
    survive: Callable[[BaseException], bool] | None = None,
    event: str = "pass",
) -> None:
    """Run ``one_pass`` once; with ``seconds`` repeat it every ``seconds`` until SIGTERM/SIGINT
    (a signal during the wait ends the loop at once; a pass in progress is finished first).

    With ``seconds``, a pass that raises an exception ``survive`` accepts (a store is away: see
    :func:`service.failures.is_outage`) does not end the loop: the next pass follows after a
    back-off (0.5 s doubling, at most ``seconds``), and the outage is logged once when it begins
    and once when a pass succeeds again (:class:`OutageLog`, ``<event>_failing`` /
    ``<event>_recovered``). Any other exception ends the loop, as does every exception of a
    single pass (``seconds`` None)."""
    outage = OutageLog(event)
    backoff = Backoff(first=min(0.5, seconds or 0.5), cap=seconds or 0.5)
    with stop_signal() as stop:
        while True:
            try:
                await one_pass()
            except Exception as exc:
                if seconds is None or survive is None or not survive(exc):
                    raise
                outage.failed(exc)
                if await wait_or_stop(stop, backoff.next()):
                    return
                continue
            outage.recovered()
            backoff.reset()
            if seconds is None or stop.is_set():
                return
            if await wait_or_stop(stop, seconds):
                return
