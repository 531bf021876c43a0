"""Count the Redis round trips and commands the purchase path sends per request.

Runs the real purchase path (service.domain.purchase.service.PurchaseService) in-process against the local
Redis, MySQL and RabbitMQ under an isolated run (own database, key prefix, queue names), then
removes everything. Counting is client-side, as the purchase call waits: every command the hot path queues on
the store's :class:`~service.adapters.redis.batcher.CommandBatcher` (``call``/``call_many``: one
round trip, shared with concurrent callers), every ``execute_command`` and every pipeline
``execute`` issued by the purchase calls is one round trip (background work such as the shard
lease renewal is not counted). ``tests/integration/purchase/test_redis_calls.py`` counts the same
on the server (MONITOR) and asserts it.

    .venv/bin/python scripts/bench_redis_calls.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Iterable
from contextvars import ContextVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from db.migrate import upgrade
from db.models import StockMode
from service.adapters.redis.batcher import Command, CommandBatcher
from service.bootstrap import Resources
from service.domain.purchase.request_id import mint_request_id
from service.domain.purchase.service import PurchaseRejected
from service.domain.stock.catalog import ProductInput
from service.log_setup import configure_logging
from service.sale.isolation import isolated_settings, new_run_id
from service.sale.stores import tear_down
from service.settings import Settings

_counting: ContextVar[Counter[str] | None] = ContextVar("counting", default=None)
_execute_command = Redis.execute_command
_pipeline_execute = Pipeline.execute
_batcher_call_many = CommandBatcher.call_many


def _count_round_trip(commands: Iterable[Command]) -> None:
    """One round trip carrying ``commands``, counted when a purchase call is being counted."""
    if (counts := _counting.get()) is not None:
        counts["round trips"] += 1
        for command in commands:
            counts[str(command[0]).lower()] += 1


async def _counted_command(self, *args, **options):  # type: ignore[no-untyped-def]
    _count_round_trip([args])
    return await _execute_command(self, *args, **options)


async def _counted_pipeline(self, *args, **options):  # type: ignore[no-untyped-def]
    _count_round_trip(command for command, _ in self.command_stack)
    return await _pipeline_execute(self, *args, **options)


async def _counted_batch(self: CommandBatcher, *commands: Command) -> list[object]:
    _count_round_trip(commands)
    return await _batcher_call_many(self, *commands)


async def _run(
    resources: Resources, product_id: int, users: range, keyed: bool = True
) -> tuple[Counter[str], Counter[str]]:
    """One purchase of 1 unit per user (``keyed``: as if it carried an Idempotency-Key, so the
    sold-out flag is not consulted); returns (outcomes, client-side counts)."""
    outcomes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    _counting.set(counts)
    for user in users:
        try:
            await resources.purchases.purchase(f"bench-{user}", product_id, 1, mint_request_id(), keyed=keyed)
            outcomes["accepted"] += 1
        except PurchaseRejected as rejected:
            outcomes[rejected.code] += 1
    _counting.set(None)
    return outcomes, counts


async def main(requests: int) -> None:
    configure_logging("WARNING")
    settings = isolated_settings(Settings(), new_run_id("bench"))
    # Round trips are counted, not rates: the purchase rate buckets (spent inside the same reserve
    # call either way) must not turn the crowd into 429s.
    no_limits = settings.rate_limit.model_copy(update={"user_per_second": 0.0, "address_per_second": 0.0})
    settings = settings.model_copy(update={"rate_limit": no_limits})
    warm_up = 50
    try:
        await upgrade(settings.db.url)
        resources = await Resources.open(settings, purchase=True)
        Redis.execute_command = _counted_command  # type: ignore[method-assign]
        Pipeline.execute = _counted_pipeline  # type: ignore[method-assign]
        CommandBatcher.call_many = _counted_batch  # type: ignore[method-assign]
        try:
            stock = warm_up + requests
            await resources.catalog.set(1, ProductInput(stock=stock, per_user_limit=1, stock_mode=StockMode.REDIS))
            await _run(resources, 1, range(warm_up))
            rows = [
                ("accept path", *await _run(resources, 1, range(warm_up, stock))),
                ("reject, Idempotency-Key", *await _run(resources, 1, range(stock, stock + requests))),
                ("reject, no key (flag)", *await _run(resources, 1, range(stock, stock + requests), keyed=False)),
            ]
        finally:
            Redis.execute_command = _execute_command  # type: ignore[method-assign]
            Pipeline.execute = _pipeline_execute  # type: ignore[method-assign]
            CommandBatcher.call_many = _batcher_call_many  # type: ignore[method-assign]
            await resources.close()
    finally:
        await tear_down(settings)
    print(f"{'path':<24} {'requests':>8}  {'outcomes':<22} {'round trips/req':>15}  commands/req")
    for name, outcomes, counts in rows:
        n = sum(outcomes.values())
        trips = counts.pop("round trips", 0)
        commands = ", ".join(f"{command} {count / n:.3f}" for command, count in sorted(counts.items()))
        print(f"{name:<24} {n:>8}  {dict(outcomes)!s:<22} {trips / n:>15.3f}  {commands}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    asyncio.run(main(parser.parse_args().requests))
