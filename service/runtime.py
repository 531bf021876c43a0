"""Process life for the long-running commands: stop on SIGTERM/SIGINT, repeat a pass with ``--watch``."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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


async def watch(seconds: float | None, one_pass: Callable[[], Awaitable[object]]) -> None:
    """Run ``one_pass`` once; with ``seconds`` repeat it every ``seconds`` until SIGTERM/SIGINT
    (a signal during the wait ends the loop at once; a pass in progress is finished first)."""
    with stop_signal() as stop:
        while True:
            await one_pass()
            if seconds is None or stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), seconds)
            except TimeoutError:
                continue
            return
