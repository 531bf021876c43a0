"""What one join or poll of a waiting room costs Redis (docs/BENCHMARKS.md, "Waiting room").

Starts a private ``redis-server`` on a free port (nothing saved; stopped at the end), loads one
product's sale terms with ``room = 1`` by hand, then through the service's own
:class:`~service.adapters.redis.waiting_room.WaitingRooms` (``lua/queue.lua`` via the command
batcher, as the API calls it), ``--concurrency`` calls in flight:

1. ``--buyers`` joins before the opening (the pre-queue: a lottery score each);
2. the opening: one call that draws and admits the first ``ceil(stock x factor)`` (at most 256 a call);
3. ``--polls`` polls by random buyers of a line ``--buyers`` long (ZRANKs);
4. the same polls once the stock is 0 (what a sold-out room costs when no flag answers; the
   units held for admitted buyers are zeroed as well, so the room is sold out).

``--factor`` is the admit factor (1: each admission holds a unit).

Per phase: calls/s seen by the client and, from ``INFO commandstats`` before and after, the
script's own time per call inside Redis (``usec``/``calls``, without I/O): the figure that does
not depend on the client's machine.

    .venv/bin/python tools/bench_waiting_room.py [--buyers 50000] [--polls 20000] [--stock 1000]
        [--concurrency 256] [--factor 1.0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.asyncio import Redis

from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.stores import open_stores
from service.model.waiting_room import RoomPace
from toolkit.sale.isolation import free_port

PREFIX = "bench"
PRODUCT = 1


def pace(factor: float) -> RoomPace:
    """Buyers told to come back within 0.1 s: the polls below come later, so each one is a full
    poll (an early one would be answered 429 before the positions are read); they come back later
    than three such intervals too, so none counts as departed (a departed buyer's poll is cheaper)."""
    return RoomPace(factor, 120_000, 100, 100, 20, 1000, depart_after_polls=1000.0)


async def _evalsha(redis: Redis) -> tuple[int, int]:
    stats = await redis.info("commandstats")
    entry = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(entry["calls"]), int(entry["usec"])


async def _phase(redis: Redis, name: str, calls: list, concurrency: int) -> dict[str, float | str]:
    before = await _evalsha(redis)
    started = time.perf_counter()
    for start in range(0, len(calls), concurrency):
        await asyncio.gather(*(call() for call in calls[start : start + concurrency]))
    seconds = time.perf_counter() - started
    after = await _evalsha(redis)
    made = after[0] - before[0]
    return {
        "phase": name,
        "calls": made,
        "calls_per_second": round(len(calls) / seconds),
        "usec_per_call_in_redis": round((after[1] - before[1]) / max(made, 1), 1),
    }


async def measure(
    url: str, buyers: int, polls: int, stock: int, concurrency: int, factor: float
) -> list[dict[str, float | str]]:
    redis = Redis.from_url(url, decode_responses=True)
    store = open_stores(redis, PREFIX)
    keys = ProductKeys(PREFIX, PRODUCT)
    now_ms = int(time.time() * 1000)
    await redis.hset(keys.sale, mapping={"starts_ms": now_ms + 3_600_000, "ends_ms": 0, "limit": 1, "price": 100})
    await redis.hset(keys.sale, mapping={"token": 0, "buckets": 1, "room": 1})
    await redis.set(keys.stock, stock)
    await store.scripts.load()
    rooms = store.rooms
    users = [f"u{i}" for i in range(buyers)]

    def visit(user: str, join: bool):
        return lambda: rooms.visit(PRODUCT, user, join=join, pace=pace(factor))

    results = [await _phase(redis, "pre-queue joins", [visit(user, True) for user in users], concurrency)]
    await redis.hset(keys.sale, "starts_ms", now_ms - 1000)
    results.append(await _phase(redis, "opening (draw + first admissions)", [visit(users[0], False)], 1))
    looks = [visit(random.choice(users), False) for _ in range(polls)]
    results.append(await _phase(redis, f"polls, line of {buyers}", looks, concurrency))
    await redis.set(keys.stock, 0)
    await redis.hset(keys.room, "held", 0)
    results.append(await _phase(redis, "polls, sold out", looks, concurrency))
    await store.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buyers", type=int, default=50_000)
    parser.add_argument("--polls", type=int, default=20_000)
    parser.add_argument("--stock", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--factor", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not installed")
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        url = f"redis://127.0.0.1:{port}/0"
        results = asyncio.run(measure(url, args.buyers, args.polls, args.stock, args.concurrency, args.factor))
    finally:
        server.terminate()
        server.wait(timeout=10)
    if args.json:
        print(json.dumps(results))
        return
    for row in results:
        print(
            f"{row['phase']:<38} {row['calls']:>7} calls  {row['calls_per_second']:>7}/s  "
            f"{row['usec_per_call_in_redis']:>8} us/call in Redis"
        )


if __name__ == "__main__":
    main()
