"""The drain rows: the reserve and the publish hop alone (the API's own classes in this
process), consumers draining a backlog (N orders published with no consumer, then
``--consumers`` ``flashsale consume`` processes started and timed until MySQL holds all N), and
beside them the raw writers (:mod:`toolkit.bench.raw_writer`) writing N orders each on the same
database.

The rate is measured between the first poll that sees an order row and the first that sees all
of them (the consumers' start-up, imports and connections, is left out); the consumers' CPU is
read from ``/proc`` over the same window.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aio_pika
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import OrderStatus
from service.adapters.broker import Publisher
from service.adapters.broker_topology import declare_topology
from service.adapters.redis.reservations import new_attempt
from service.adapters.redis.stores import make_stores
from service.model.order_message import OrderMessage
from service.model.stock import ReserveOutcome, ReserveRequest
from service.settings import Settings
from toolkit.bench import profile
from toolkit.bench.context import (
    DRAIN,
    PRICE,
    RAW_BATCH,
    RAW_CONNECTIONS,
    RAW_ONE,
    RESERVE,
    BenchError,
    Context,
)
from toolkit.bench.procstat import CpuSample
from toolkit.bench.raw_writer import RawOrder, make_orders, write_orders
from toolkit.bench.rows import DRAIN_ROWS, Row, merge_rounds
from toolkit.bench.server import Child, flashsale_argv

POLL_SECONDS = 0.05
STALL_SECONDS = 30.0  # no new order row for this long: the drain is over, some orders missing
DRAIN_TIMEOUT = 300.0  # seconds


async def purge_orders(settings: Settings) -> None:
    """Empty the run's order queues (the accept rows' messages, which no consumer took)."""
    connection = await aio_pika.connect(settings.amqp.url)
    try:
        _, queues = await declare_topology(await connection.channel(), settings.amqp)
        for queue in queues:
            await queue.purge()
    finally:
        await connection.close()


async def _hop_in_process(
    ctx: Context, spec: tuple[str, str, str | None], unit: str, count: int, work: Callable[[], Awaitable[None]]
) -> Row:
    """Run ``--connections`` copies of ``work`` (each taking its items from a shared iterator)
    together; the row of ``spec``: ``count`` items per second and the CPU of this process
    (``server``: nothing else runs in it meanwhile) and of the stores."""
    groups = {"server": [os.getpid()], **ctx.stores}
    started, before = time.perf_counter(), CpuSample.take(groups)
    await asyncio.gather(*(work() for _ in range(ctx.options.connections)))
    seconds = time.perf_counter() - started
    cpu = before.shares(CpuSample.take(groups), seconds)
    key, label, ref = spec
    return Row(key, label, unit, round(count / seconds, 1), count, round(seconds, 3), ref, cpu=cpu)


async def reserve_only(ctx: Context, orders: list[RawOrder]) -> Row:
    """Reserve ``orders`` through the API's own :class:`Reservations` (the reserve script, the
    command batcher), ``--connections`` calls in flight as the HTTP rows have requests.

    Returns the ``reserve`` row: reservations per second and the CPU of this process (``server``)
    and the stores, the reserve hop alone.

    Raises:
        BenchError: a reservation was refused (the product is sized for all of them).
    """
    stores = make_stores(ctx.settings)
    try:
        await stores.scripts.load()
        todo = iter(orders)
        refused: list[str] = []

        async def reserve_in_turn() -> None:
            for o in todo:  # shared: each order is taken by one task
                answer = await stores.reservations.reserve(
                    ReserveRequest(o.product_id, o.request_id, o.user_id, 1, o.order_no, new_attempt())
                )
                if answer.outcome is not ReserveOutcome.RESERVED:
                    refused.append(str(answer.outcome))

        row = await _hop_in_process(ctx, DRAIN_ROWS[0], "res/s", len(orders), reserve_in_turn)
    finally:
        await stores.aclose()
    if refused:
        raise BenchError(f"reserve only: {len(refused)} reservations refused, e.g. {refused[0]}")
    return row


async def publish_backlog(ctx: Context, orders: list[RawOrder]) -> Row:
    """Empty the run's order queue, then publish ``orders`` for the consumers to find waiting,
    through the API's own :class:`Publisher` (its channels, persistent, mandatory, each publish
    awaiting its confirm), ``--connections`` publishes in flight as the HTTP rows have requests.

    Returns the ``publish`` row: orders per second (each in a message of its own, or in groups
    when the settings say so) and the CPU of this process (``server``:
    nothing else runs in it meanwhile), the publish hop alone.
    """
    settings = ctx.settings
    await purge_orders(settings)
    publisher = Publisher(settings.amqp)
    await publisher.connect()
    try:
        now_ms = int(time.time() * 1000)
        messages = iter(
            [OrderMessage(o.request_id, o.order_no, o.user_id, o.product_id, 1, now_ms, o.amount) for o in orders]
        )

        async def publish_in_turn() -> None:
            for message in messages:  # shared: each message is taken by one task
                await publisher.publish(message)

        return await _hop_in_process(ctx, DRAIN_ROWS[1], "orders/s", len(orders), publish_in_turn)
    finally:
        await publisher.close()


@dataclass(frozen=True, slots=True)
class DrainResult:
    """``orders`` written in ``seconds`` (first row seen to the last written); ``cpu`` = cores
    per group; ``missing`` = orders never written (the drain stalled: dead-lettered or stuck)."""

    orders: int
    seconds: float
    cpu: dict[str, float]
    missing: int = 0


async def time_drain(
    engine: AsyncEngine,
    product_id: int,
    expected: int,
    consumers: list[Child],
    cpu_groups: dict[str, list[int]],
    *,
    start: tuple[float, CpuSample] | None = None,
    quiet: float = 0.0,
    on_first: Callable[[], None] | None = None,
) -> DrainResult:
    """Poll the product's order rows every :data:`POLL_SECONDS` until ``expected`` (and then
    until none was added for ``quiet`` seconds: orders of requests still in flight), or until
    no row was added for :data:`STALL_SECONDS` (a message retried past the delivery limit is
    dead-lettered and never arrives): then the rate counts the rows written until the last one.
    The window starts at the first poll that saw a row, or at ``start`` (a time and a CPU
    sample taken then, e.g. the load's first request) when given. ``on_first`` is called at the
    first poll that saw a row.

    Raises:
        RuntimeError: a consumer exited, nothing was written, or the drain passed :data:`DRAIN_TIMEOUT` s.
    """
    query = text("SELECT COUNT(*) FROM orders WHERE product_id = :p")
    deadline = time.monotonic() + DRAIN_TIMEOUT
    first: tuple[float, int, CpuSample] | None = None
    last: tuple[float, int, CpuSample] | None = None
    async with engine.connect() as conn:
        while time.monotonic() < deadline:
            for consumer in consumers:
                consumer.check_alive()
            rows = (await conn.execute(query, {"p": product_id})).scalar_one()
            await conn.commit()  # a fresh snapshot for the next poll
            now = time.perf_counter()
            if rows > 0 and (last is None or rows > last[1]):
                last = (now, rows, CpuSample.take(cpu_groups))
                if first is None and on_first is not None:
                    on_first()
                first = first or last
            if first is not None and last is not None:
                stalled = now - last[0] > STALL_SECONDS
                if stalled or (rows >= expected and now - last[0] >= quiet):
                    (started, seen, before), (ended, written, after) = first, last
                    if start is not None:
                        (started, before), seen = start, 0
                    elif ended - started <= 0:  # everything arrived between two polls
                        started, seen = ended - POLL_SECONDS, 0
                    wall = ended - started
                    return DrainResult(written - seen, wall, before.shares(after, wall), max(expected - written, 0))
            await asyncio.sleep(POLL_SECONDS)
    logs = ", ".join(str(consumer.log) for consumer in consumers)
    raise RuntimeError(f"the consumers did not drain {expected} orders within {DRAIN_TIMEOUT:.0f}s; see {logs}")


async def rejected_orders(engine: AsyncEngine, product_id: int) -> int:
    """Orders of ``product_id`` the consumers wrote ``rejected`` (sold out or over the limit)."""
    query = text("SELECT COUNT(*) FROM orders WHERE product_id = :p AND status = :s")
    async with engine.connect() as conn:
        return int((await conn.execute(query, {"p": product_id, "s": OrderStatus.REJECTED})).scalar_one())


def _drain_note(drained: DrainResult, consumers: list[Child], rejected: int) -> str:
    note = f"{len(consumers)} consumer process(es); rate from the first order row seen to the last"
    if rejected:  # the backlog is sized to fit stock and limit: these measured the reject path
        note += f"; {rejected} orders written rejected, not applied"
    if drained.missing:
        logs = ", ".join(str(consumer.log) for consumer in consumers)
        note += f"; {drained.missing} orders never written (dead-lettered or stuck: see {logs})"
    return note


def _profile(consumers: list[Child], directory: Path, spies: dict[str, subprocess.Popen[bytes]]) -> None:
    """Start py-spy on each of ``consumers`` (``consumer-<n>`` in ``spies``), until stopped."""
    for n, consumer in enumerate(consumers):
        spies[f"consumer-{n}"] = profile.start(consumer.process.pid, directory / f"consumer-{n}.txt", None)


async def drain_rows(ctx: Context, engine: AsyncEngine) -> list[Row]:
    """Per round: the consumer on a published backlog, then the raw writers on the same
    database, each on products of their own (``backlog`` units each)."""
    opts = ctx.options
    _, _, (consumer_key, consumer_label, consumer_ref), one, batch = DRAIN_ROWS
    measured: dict[str, list[Row]] = {key: [] for key, _, _ in DRAIN_ROWS}
    for r in range(opts.rounds):
        ctx.console.print(f"round {r + 1}/{opts.rounds}: reserving {opts.backlog} orders")
        measured["reserve"].append(await reserve_only(ctx, make_orders(RESERVE + r, opts.backlog, 93, PRICE)))
        ctx.console.print(f"round {r + 1}/{opts.rounds}: publishing a backlog of {opts.backlog} orders")
        measured["publish"].append(await publish_backlog(ctx, make_orders(DRAIN + r, opts.backlog, 90, PRICE)))
        ctx.console.print(f"round {r + 1}/{opts.rounds}: {consumer_label}")
        consumers = [
            Child(f"consumer-{n}", flashsale_argv("consume"), ctx.env, ctx.log_dir) for n in range(opts.consumers)
        ]
        spies: dict[str, subprocess.Popen[bytes]] = {}
        on_first = None
        if r == 0 and opts.profile_dir is not None:  # from their first order row on: start-up left out
            on_first = functools.partial(_profile, consumers, opts.profile_dir, spies)
        try:
            groups = {"server": [consumer.process.pid for consumer in consumers], **ctx.stores}
            drained = await time_drain(engine, DRAIN + r, opts.backlog, consumers, groups, on_first=on_first)
        finally:
            for name, spy in spies.items():
                await asyncio.to_thread(profile.stop, spy)
                if opts.profile_dir is not None:
                    ctx.profiles[name] = profile.summarize(opts.profile_dir / f"{name}.txt")
            await asyncio.gather(*(consumer.stop() for consumer in consumers))
        rate = round(drained.orders / drained.seconds, 1)
        measured[consumer_key].append(
            Row(
                consumer_key,
                consumer_label,
                "orders/s",
                rate,
                drained.orders,
                round(drained.seconds, 3),
                consumer_ref,
                cpu=drained.cpu,
                note=_drain_note(drained, consumers, await rejected_orders(engine, DRAIN + r)),
            )
        )
        url = ctx.settings.db.url
        for (key, _, ref), product, per_tx in ((one, RAW_ONE + r, 1), (batch, RAW_BATCH + r, opts.batch)):
            label = f"raw {per_tx}/tx"
            ctx.console.print(f"round {r + 1}/{opts.rounds}: {label}")
            orders = make_orders(product, opts.backlog, 91 if per_tx == 1 else 92, PRICE)
            groups = {"client": [os.getpid()], **ctx.stores}
            started, before = time.perf_counter(), CpuSample.take(groups)
            result = await write_orders(url, orders, per_tx, RAW_CONNECTIONS)
            cpu = before.shares(CpuSample.take(groups), time.perf_counter() - started)
            measured[key].append(
                Row(
                    key,
                    label,
                    "orders/s",
                    round(result.orders / result.seconds, 1),
                    result.orders,
                    round(result.seconds, 3),
                    ref,
                    p50_ms=result.p50_ms,
                    p99_ms=result.p99_ms,
                    cpu=cpu,
                    note=f"latency per transaction; {result.retries} retries",
                )
            )
    return [merge_rounds(rounds) for rounds in measured.values()]
