"""Hooks for every test: a hung test shows where it hangs.

Each test has a time limit (pytest-timeout, ``timeout`` in pyproject.toml; a hang fails that one
test instead of the whole run). Some seconds before the limit, every asyncio task's stack is
printed on the terminal: the main thread's own stack only shows the event loop waiting.
``kill -USR1 <pytest pid>`` prints the same at any time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import pytest

DUMP_BEFORE_TIMEOUT_SECONDS = 15.0
_DUMP_TIMER = pytest.StashKey[threading.Timer]()


def _dump_tasks(signum: int, frame: object) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        print("no running event loop", file=sys.__stderr__)
        return
    for task in asyncio.all_tasks(loop):
        print(f"=== {task!r}", file=sys.__stderr__)
        task.print_stack(limit=40, file=sys.__stderr__)


signal.signal(signal.SIGUSR1, _dump_tasks)


def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> None:
    """pytest-timeout's hook (it sets its own timer after this one): arm the task dump."""
    timeout = getattr(settings, "timeout", None)
    if timeout:
        print_at = max(timeout - DUMP_BEFORE_TIMEOUT_SECONDS, timeout / 2)
        timer = threading.Timer(print_at, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.daemon = True
        timer.start()
        item.stash[_DUMP_TIMER] = timer


def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    timer = item.stash.get(_DUMP_TIMER, None)
    if timer is not None:
        timer.cancel()
