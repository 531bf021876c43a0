"""The consumer's batch transaction against the raw batched writer, on a private MariaDB (nothing
else uses it, so its CPU is theirs alone): ``--orders`` orders of one product written through
:func:`service.domain.fulfilment.order_writer.write_orders` in batches of 100 by ``--writers``
tasks (no Redis claim, no RabbitMQ), then by the bench's raw writer (8 asyncmy connections, 100
orders a transaction), ``--repeats`` times alternated. Per order: the CPU of this process (the
client) and of ``mariadbd`` (from ``/proc``), and the rate (docs/BENCHMARKS.md, "The consumer
drain"). To compare two commits, run it from each, alternately (``PYTHONPATH=<worktree>``).

    .venv/bin/python tools/bench_consumer_writes.py [--orders 20000] [--writers 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import uvloop
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from db.migrate import create_database, upgrade
from service.domain.fulfilment.order_writer import write_orders
from service.model.order_message import OrderMessage
from tests.servers import PrivateMariaDB
from toolkit.bench.raw_writer import make_orders
from toolkit.bench.raw_writer import write_orders as raw_write

PRICE = 1500
BATCH = 100


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _writer(engine: AsyncEngine, batches: Iterator[list[OrderMessage]]) -> None:
    for batch in batches:  # shared: each batch goes to one writer
        await write_orders(engine, batch)


async def main(count: int, writers: int, repeats: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="consumer-writes-"))
    server = PrivateMariaDB(root)
    await server.start()
    mariadbd = int((root / "mariadb.pid").read_text())
    url = server.url("bench")
    await create_database(url)
    await upgrade(url)
    engine = make_engine(url, pool_size=writers + 2)
    product = 100
    try:
        for repeat in range(repeats):
            for kind in ("consumer", "raw"):
                product += 1
                async with engine.begin() as conn:
                    await conn.execute(
                        text(
                            "INSERT INTO products (id, name, price, per_user_limit, sale_starts_at, stock_mode)"
                            " VALUES (:id, 'bench', :price, :n, UTC_TIMESTAMP(), 'redis')"
                        ),
                        {"id": product, "price": PRICE, "n": count},
                    )
                    await conn.execute(
                        text("INSERT INTO inventory (product_id, stock, sold, version) VALUES (:id, :n, 0, 0)"),
                        {"id": product, "n": count},
                    )
                orders = make_orders(product, count, 90 + repeat, PRICE)
                messages = [
                    OrderMessage(o.request_id, o.order_no, o.user_id, o.product_id, 1, 0, o.amount) for o in orders
                ]
                batches = iter([messages[i : i + BATCH] for i in range(0, count, BATCH)])

                client, server_cpu, started = time.process_time(), _cpu_seconds(mariadbd), time.perf_counter()
                if kind == "raw":
                    await raw_write(url, orders, BATCH, 8)
                else:
                    await asyncio.gather(*(_writer(engine, batches) for _ in range(writers)))
                wall = time.perf_counter() - started
                client, server_cpu = time.process_time() - client, _cpu_seconds(mariadbd) - server_cpu
                print(
                    f"{kind:8} {count / wall:8.0f} orders/s  client {client / count * 1e6:5.1f} us/order"
                    f"  mariadbd {server_cpu / count * 1e6:5.1f} us/order",
                    flush=True,
                )
    finally:
        await engine.dispose()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=20_000)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    arguments = parser.parse_args()
    uvloop.run(main(arguments.orders, arguments.writers, arguments.repeats))
