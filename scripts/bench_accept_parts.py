"""What each part of the accept path costs, in process and without HTTP: the process's CPU time
per call of the order number minter, the reserve script (with its mint), the post-confirm mark
queued, one publish with its broker confirm, and the whole ``PurchaseService.purchase`` (all of
them, in the order the purchase makes them), each called by ``--concurrency`` callers at once on
the real Redis, RabbitMQ and MariaDB of an isolated run. Best of ``--repeats`` loops of
``--calls`` calls, microseconds per call; the parts need not add up to the whole (batching
depends on what runs beside a call). Where the accept path's time goes beside the no-op
(``scripts/bench_accept_inproc.py`` has the HTTP layers).

Run it with the machine otherwise idle (it is no test: nothing is asserted about time).

    .venv/bin/python scripts/bench_accept_parts.py [--calls 6000] [--repeats 2] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

from db.migrate import upgrade
from db.models import StockMode
from service.adapters.broker import OrderMessage
from service.adapters.redis.reservations import new_attempt
from service.bench.run import bench_settings
from service.bootstrap import Resources
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock.catalog import ProductInput
from service.sale.isolation import new_run_id
from service.sale.stores import tear_down
from service.settings import Settings

PRODUCT = 7
QUEUED_ORDER_NO = "FS2026120300000000000000001"


async def _cpu_per_call(call: Callable[[int], Awaitable[object]], calls: int, concurrency: int, repeats: int) -> float:
    """Best CPU microseconds per ``call(n)`` over ``repeats`` loops of ``calls`` calls made by
    ``concurrency`` callers at once."""
    best = float("inf")
    for _ in range(repeats):
        numbers = iter(range(calls))  # shared: each number is called once, by whichever caller is free

        async def caller(numbers: Iterator[int]) -> None:
            for n in numbers:
                await call(n)

        started = time.process_time()
        await asyncio.gather(*(caller(numbers) for _ in range(concurrency)))
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


async def main(calls: int, repeats: int, concurrency: int) -> None:
    os.environ.setdefault("FLASHSALE_ENV", "development")
    settings = bench_settings(Settings(), new_run_id("parts"))
    await upgrade(settings.db.url)
    resources = await Resources.open(settings)
    try:
        product = ProductInput(stock=10**9, price=100, per_user_limit=10**9, stock_mode=StockMode.REDIS)
        await resources.catalog.set(PRODUCT, product)
        purchases, store, publisher = resources.purchases, resources.store, resources.publisher
        assert purchases is not None and publisher is not None
        minter = purchases._minter  # the purchase's own minter: the same blocks and batcher

        async def reserve(n: int) -> None:
            await store.reservations.reserve(PRODUCT, mint_request_id(), f"u{n}", 1, await minter.take(), new_attempt())

        async def mark_queued(n: int) -> None:
            await store.reservations.mark_queued(PRODUCT, mint_request_id(), QUEUED_ORDER_NO, f"u{n}", 1)

        async def publish(n: int) -> None:
            await publisher.publish(OrderMessage(mint_request_id(), QUEUED_ORDER_NO, f"u{n}", PRODUCT, 1, 0, 100))

        async def purchase(n: int) -> None:
            await purchases.purchase(f"b{n}", PRODUCT, 1, mint_request_id(), keyed=False)

        parts: list[tuple[str, Callable[[int], Awaitable[object]]]] = [
            ("mint an order number", lambda n: minter.take()),
            ("mint + reserve", reserve),
            ("mark queued", mark_queued),
            ("publish + confirm", publish),
            ("PurchaseService.purchase", purchase),
        ]
        results = [(label, await _cpu_per_call(call, calls, concurrency, repeats)) for label, call in parts]
    finally:
        await resources.close()
        await tear_down(settings)
    print(f"{'part':26} {'CPU us/call':>11}  ({concurrency} callers at once)")
    for label, micros in results:
        print(f"{label:26} {micros:11.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    arguments = parser.parse_args()
    sys.stderr = io.TextIOWrapper(open(os.devnull, "wb"))  # the services' log lines, not the report
    asyncio.run(main(arguments.calls, arguments.repeats, arguments.concurrency))
