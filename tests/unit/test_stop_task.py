"""stop_task ends a task even when the task drops a cancellation (service.runtime.stop_task)."""

from __future__ import annotations

import asyncio

import pytest

from service.runtime import stop_task


async def test_a_task_that_drops_its_first_cancellation_is_stopped_all_the_same():
    dropped = 0

    async def loop() -> None:
        nonlocal dropped
        while True:
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                if dropped:
                    raise
                dropped += 1  # as Python 3.11's asyncio.wait_for can (CPython gh-86296)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await stop_task(task)
    assert task.cancelled() and dropped == 1


async def test_the_error_a_task_ended_with_is_raised():
    async def fails() -> None:
        raise ValueError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="boom"):
        await stop_task(task)


async def test_a_finished_task_is_left_as_it_is():
    task = asyncio.create_task(asyncio.sleep(0, "done"))
    await task
    await stop_task(task)
    assert task.result() == "done"
