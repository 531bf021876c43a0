"""The sale's queue sampler, for the report's queue chart: order rows of the product in MySQL and
messages ready in the order queues, every :data:`QUEUE_SAMPLE_SECONDS` while the sale runs.

It runs on a thread of its own, with its own event loop and its own connections. On the sale's
loop, which also sends the load (hundreds of requests in flight), it got one sample every 1.3 to
1.8 s during a purchase wave instead of ten a second, and the chart's backlog was a few points
of guesswork. Its own channel also keeps it apart from the sale's checks: aiormq closes a channel
whose call was cancelled, and a sampler stopped mid-call on the sale's channel once made the
final count of dead letters fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

from service.settings import Settings
from toolkit.sale.errors import stderr
from toolkit.sale.stores import Stores

QUEUE_SAMPLE_SECONDS = 0.1
SAMPLER_STOP_SECONDS = 10.0
"""How long the end of :func:`sampling_queue` waits for the sample in progress (then the thread,
a daemon, is left to end with the process)."""

Sample = tuple[float, int, int]
"""(epoch seconds, order rows of the product in MySQL, messages ready)."""


async def _sample(settings: Settings, product_id: int, timeline: list[Sample], stop: threading.Event) -> None:
    async with AsyncExitStack() as stack:
        stores = await Stores.open(stack, settings)
        while not stop.is_set():
            rows = await stores.count_orders(product_id)
            timeline.append((time.time(), rows, await stores.order_queue_depth()))
            await asyncio.sleep(QUEUE_SAMPLE_SECONDS)


def _run(settings: Settings, product_id: int, timeline: list[Sample], stop: threading.Event) -> None:
    try:
        asyncio.run(_sample(settings, product_id, timeline, stop))
    except Exception as exc:  # a failed sample only ends the chart early: the checks ask the stores again
        stderr.print(f"[yellow]warning:[/] the queue sampler stopped: {exc!r}")


@contextlib.asynccontextmanager
async def sampling_queue(settings: Settings, product_id: int) -> AsyncIterator[list[Sample]]:
    """While the block runs: a :data:`Sample` of ``product_id`` every :data:`QUEUE_SAMPLE_SECONDS`
    (the list grows as they come; read it after the block)."""
    timeline: list[Sample] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=_run, args=(settings, product_id, timeline, stop), name="queue-sampler", daemon=True
    )
    thread.start()
    try:
        yield timeline
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, SAMPLER_STOP_SECONDS)
