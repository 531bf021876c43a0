"""Time ``flashsale consume`` draining a backlog into MySQL, beside raw asyncmy writers, in one run.

Under an isolated run (own database, key prefix, queue names; everything removed at the end):

1. raw writer, one order per transaction: 8 asyncmy connections, each order
   ``UPDATE inventory ... WHERE stock >= 1`` + ``INSERT`` order + ``COMMIT``;
2. raw writer, ``--raw-batch`` orders per transaction (one multi-row INSERT, one UPDATE);
3. for each consumer source (this checkout, and with ``--before DIR`` an unpacked older
   checkout, e.g. ``git archive main | tar -x -C DIR``): ``--orders`` order messages are published
   to the run's queue, then ``--consumers`` ``flashsale consume --prefetch N`` processes drain
   them. The rate counts from the first order row to the last (process start-up is not timed).

Every product has stock for every order, so all are applied. Prints orders/s and each rate's
ratio to the raw one-order-per-transaction writer.

    .venv/bin/python scripts/bench_consumer.py [--orders 5000] [--prefetch 256] [--consumers 1]
        [--before DIR] [--before-prefetch 64] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import asyncmy
from sqlalchemy import text
from sqlalchemy.engine import make_url

from db.migrate import upgrade
from service.adapters.broker import OrderMessage, declare_topology, encode_order
from service.bootstrap import Resources
from service.domain.catalog import ProductInput
from service.domain.order_no import compose_order_no
from service.domain.request_id import mint_request_id
from service.log_setup import configure_logging
from service.sale.isolation import environment, isolated_settings, new_run_id
from service.sale.stores import tear_down
from service.settings import Settings

RAW_CONNECTIONS = 8
_INSERT = (
    "INSERT INTO orders (order_no, request_id, user_id, product_id, quantity, amount, status)"
    " VALUES (%s, %s, %s, %s, 1, 1500, 0)"
)
_TAKE = (
    "UPDATE inventory SET stock = stock - %s, sold = sold + %s, version = version + 1"
    " WHERE product_id = %s AND stock >= %s"
)
_sequences = iter(range(1, 999_999))


def _orders(product_id: int, n: int) -> list[OrderMessage]:
    return [
        OrderMessage(
            mint_request_id(),
            compose_order_no("FS", "20261130000000", 97, next(_sequences)),
            f"u{i}",
            product_id,
            1,
            0,
            1500,
        )
        for i in range(n)
    ]


async def _raw_writer(settings: Settings, product_id: int, n: int, per_transaction: int) -> float:
    """Orders/s of RAW_CONNECTIONS asyncmy connections writing ``n`` orders, ``per_transaction`` a transaction."""
    url = make_url(settings.db.url)
    pool = await asyncmy.create_pool(
        host=url.host,
        port=url.port or 3306,
        user=url.username,
        password=url.password or "",
        db=url.database,
        minsize=RAW_CONNECTIONS,
        maxsize=RAW_CONNECTIONS,
        autocommit=False,
    )
    orders = _orders(product_id, n)
    chunks = [orders[i : i + per_transaction] for i in range(0, n, per_transaction)]

    async def worker() -> None:
        async with pool.acquire() as conn:
            while chunks:
                chunk = chunks.pop()
                async with conn.cursor() as cursor:
                    await cursor.execute(_TAKE, (len(chunk), len(chunk), product_id, len(chunk)))
                    await cursor.executemany(
                        _INSERT, [(o.order_no, o.request_id, o.user_id, product_id) for o in chunk]
                    )
                await conn.commit()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(RAW_CONNECTIONS)))
    elapsed = time.perf_counter() - started
    pool.close()
    await pool.wait_closed()
    return n / elapsed


async def _publish(settings: Settings, orders: list[OrderMessage]) -> None:
    connection = await aio_pika.connect(settings.amqp.url)
    try:
        channel = await connection.channel()
        exchange, _ = await declare_topology(channel, settings.amqp)
        for i in range(0, len(orders), 500):
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(
                            encode_order(o), message_id=o.request_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        ),
                        routing_key=settings.amqp.queue,
                    )
                    for o in orders[i : i + 500]
                )
            )
    finally:
        await connection.close()


async def _drain(
    resources: Resources, product_id: int, n: int, command: list[str], env: dict[str, str], consumers: int
) -> float:
    """Orders/s of ``consumers`` processes running ``command`` until ``n`` rows of ``product_id`` exist."""
    await _publish(resources.settings, _orders(product_id, n))
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
        for _ in range(consumers)
    ]
    count = text("SELECT COUNT(*) FROM orders WHERE product_id = :p")
    first: tuple[float, int] | None = None
    try:
        while True:
            async with resources.engine.connect() as conn:
                rows = (await conn.execute(count, {"p": product_id})).scalar_one()
            now = time.perf_counter()
            if first is None and rows > 0:
                first = (now, rows)
            if rows >= n:
                break
            if any(p.poll() is not None for p in processes):
                raise RuntimeError("a consumer exited early")
            await asyncio.sleep(0.01)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(30)
    assert first is not None
    return (n - first[1]) / (now - first[0])


def _command(source: str | None, prefetch: int) -> tuple[list[str], dict[str, str]]:
    python = str(Path(sys.executable))
    run = [python, "-c", "from service.cli.main import main; main()", "consume", "--prefetch", str(prefetch)]
    env = dict(os.environ)
    if source is not None:  # an older checkout's packages shadow this one's
        env["PYTHONPATH"] = source
    env["FLASHSALE_LOG_LEVEL"] = "WARNING"
    return run, env


async def main(args: argparse.Namespace) -> None:
    configure_logging("WARNING")
    settings = isolated_settings(Settings(), new_run_id("bcons"))
    settings = settings.model_copy(update={"db": settings.db.model_copy(update={"pool_size": 4, "max_overflow": 0})})
    sources: list[tuple[str, str | None, int]] = [("consumer (this checkout)", None, args.prefetch)]
    if args.before:
        sources.insert(0, ("consumer (before)", args.before, args.before_prefetch))
    results: dict[str, list[float]] = {}
    product_ids = iter(range(1, 10_000))
    try:
        await upgrade(settings.db.url)
        resources = await Resources.open(settings, publish=False, purchase=False)
        try:
            for _ in range(args.rounds):
                rows: list[tuple[str, float]] = []
                for per_transaction, name in (
                    (1, "raw writer, 1 order/transaction"),
                    (args.raw_batch, f"raw writer, {args.raw_batch} orders/transaction"),
                ):
                    product_id = next(product_ids)
                    await resources.catalog.set(product_id, ProductInput(stock=args.orders, per_user_limit=1))
                    rows.append((name, await _raw_writer(settings, product_id, args.orders, per_transaction)))
                for name, source, prefetch in sources:
                    product_id = next(product_ids)
                    await resources.catalog.set(product_id, ProductInput(stock=args.orders, per_user_limit=1))
                    command, env = _command(source, prefetch)
                    env |= environment(settings)
                    env["FLASHSALE_LOG_LEVEL"] = "WARNING"
                    rows.append(
                        (
                            f"{name} x{args.consumers}, prefetch {prefetch}",
                            await _drain(resources, product_id, args.orders, command, env, args.consumers),
                        )
                    )
                for name, rate in rows:
                    results.setdefault(name, []).append(rate)
        finally:
            await resources.close()
    finally:
        await tear_down(settings)
    raw = results["raw writer, 1 order/transaction"]
    print(
        f"{args.orders} orders, {args.rounds} round(s);"
        " ratio = rate / the raw 1-order-per-transaction rate of its round"
    )
    for name, rates in results.items():
        ratios = ", ".join(f"{r / b:.2f}" for r, b in zip(rates, raw, strict=True))
        print(f"{name:<48} {', '.join(f'{r:,.0f}' for r in rates):>20} orders/s   ratio {ratios}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--prefetch", type=int, default=256)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--raw-batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--before", default=None, help="an older checkout whose consumer to time as well")
    parser.add_argument("--before-prefetch", type=int, default=64, help="its prefetch (main's default: 64)")
    arguments = parser.parse_args()
    if arguments.before:
        arguments.before = os.path.abspath(arguments.before)
    asyncio.run(main(arguments))
