"""Measure how long realignment blocks Redis with a big journal: the longest single Redis
command (Lua call, HSCAN, ...) of one dry run and one writing pass over a product whose journal
holds ``--entries`` reservations (a pass once made one Lua call over the whole journal: 200k entries
blocked Redis 1.04 s; see docs/BENCHMARKS.md).

Starts a Redis server of its own on a free port (it turns SLOWLOG on for every command, which the
shared server must not be asked to do) and uses an isolated run on the configured MySQL (own
database, removed at the end). ``--resolved`` of the entries get an order row first (written as
a consumer would), so the pass has entries to drop. Durations are Redis's own (SLOWLOG, in
microseconds of server time), not the client's.

    .venv/bin/python tools/bench_realign_journal.py [--entries 200000] [--resolved 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from db.migrate import upgrade
from db.models import StockMode
from service.bootstrap import Job, open_job
from service.domain.fulfilment.order_writer import apply_order
from service.domain.order_numbers.format import compose_order_no
from service.domain.stock.catalog import ProductInput
from service.log_setup import configure_logging
from service.model.order_message import OrderMessage
from service.settings import Settings
from toolkit.sale.isolation import free_port, isolated_settings, new_run_id
from toolkit.sale.stores import tear_down

PRODUCT = 1


async def _fill(redis: Redis, resources: Job, entries: int) -> list[OrderMessage]:
    """``entries`` one-unit reservations written as reserve.lua writes them (journal entry, stock
    and the journal-units counter), pipelined; returns their messages."""
    keys = resources.store.product_keys(PRODUCT)
    now_ms = int(time.time() * 1000) - 120_000
    messages = []
    for start in range(0, entries, 5000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + 5000, entries)):
                order_no = compose_order_no("FS", "20261130000000", i // 100_000, i % 100_000)
                request_id = f"{i:032x}"
                pipe.hset(keys.journal, request_id, f"u{i}|1|{order_no}|{now_ms}|1500|0")
                messages.append(OrderMessage(request_id, order_no, f"u{i}", PRODUCT, 1, now_ms, 1500))
            await pipe.execute()
    await redis.decrby(keys.stock, entries)
    await redis.incrby(keys.units, entries)
    return messages


async def _longest(redis: Redis) -> tuple[int, str, int]:
    """(longest duration in microseconds, that command, commands logged) since the last reset."""
    log = await redis.slowlog_get(1_000_000)
    await redis.slowlog_reset()
    worst = max(log, key=lambda entry: entry["duration"])
    command = worst["command"].decode() if isinstance(worst["command"], bytes) else str(worst["command"])
    return int(worst["duration"]), command[:60], len(log)


async def main(redis_url: str, entries: int, resolved: int) -> None:
    configure_logging("WARNING")
    base = isolated_settings(Settings(), new_run_id("bench"))
    settings = base.model_copy(update={"redis": base.redis.model_copy(update={"url": redis_url})})
    redis = Redis.from_url(settings.redis.url)
    try:
        for _ in range(100):
            try:
                await redis.ping()
                break
            except (OSError, RedisError):
                await asyncio.sleep(0.05)
        await upgrade(settings.db.url)
        resources = await open_job(settings, publish=False)
        try:
            await resources.catalog.set(
                PRODUCT, ProductInput(stock=entries + 1000, per_user_limit=1, stock_mode=StockMode.REDIS)
            )
            messages = await _fill(redis, resources, entries)
            for message in messages[:resolved]:
                await apply_order(resources.engine, message)
            await redis.config_set("slowlog-log-slower-than", 0)
            await redis.config_set("slowlog-max-len", 1_000_000)
            await redis.slowlog_reset()
            print(f"journal entries {entries}, of them with an order row {resolved}")
            for dry_run in (True, False):
                started = time.perf_counter()
                report = await resources.realigner.realign(PRODUCT, dry_run=dry_run)
                took = time.perf_counter() - started
                longest, command, calls = await _longest(redis)
                print(
                    f"{'dry run' if dry_run else 'writing pass':<13} pass {took:6.2f} s  Redis commands {calls:>6}"
                    f"  longest single command {longest / 1000:8.2f} ms ({command})"
                    f"  stock after {report.redis_stock_after}, in flight {report.in_flight}"
                )
        finally:
            await resources.close()
    finally:
        await redis.aclose()
        await tear_down(settings)


def run(entries: int, resolved: int) -> None:
    """:func:`main` on a Redis server of its own, stopped at the end."""
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        asyncio.run(main(f"redis://127.0.0.1:{port}/0", entries, resolved))
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--resolved", type=int, default=1000)
    arguments = parser.parse_args()
    run(arguments.entries, arguments.resolved)
