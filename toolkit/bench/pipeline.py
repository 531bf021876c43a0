"""The pipeline rows: the whole purchase path, HTTP to MySQL, under a stampede (docs/BENCHMARKS.md).

Per row (:data:`toolkit.bench.rows.PIPELINE_ROWS`) an ``api`` server and ``--consumers``
``flashsale consume`` processes run with the row's environment (``pipeline``: the defaults, group
publishing on; ``pipeline_single``: ``FLASHSALE_AMQP__GROUP_MAX=1``). Each round, per row: the
order queues are emptied, the consumers started and awaited on the queues, a 1 s warm-up on a
product of its own is sent and drained, then wrk sends ``--duration`` seconds of purchases of a
new product by new buyers (:mod:`toolkit.bench.buyers`), and the window runs from wrk's start
until the last accepted order is committed in MySQL (no order row added for
:data:`QUIET_SECONDS` after the count reached wrk's 202s: requests still in flight when wrk stopped
are counted too). The CPU of every process (the API, the consumers, RabbitMQ, Redis, MariaDB,
wrk) and of the machine is read over the same window. Both rows run with the same wrk connections
and duration (a closed loop: the same concurrency offered, each reaching its own rate), the order
of the two alternating by round.
"""

from __future__ import annotations

import asyncio
import time

import aio_pika
from sqlalchemy.ext.asyncio import AsyncEngine

from service.settings import Settings
from toolkit.bench.buyers import BUYERS, buyers_reached
from toolkit.bench.context import WARMUP_SECONDS, BenchError, Context, pipeline_product
from toolkit.bench.drain import DrainResult, purge_orders, rejected_orders, time_drain
from toolkit.bench.http_rows import buyers_script, purchase_body, start_server
from toolkit.bench.procstat import CpuSample, process_tree
from toolkit.bench.rows import PIPELINE_ROWS, PipelineSpec, Row, fill_cpu_per_order, merge_rounds
from toolkit.bench.server import Child, flashsale_argv
from toolkit.bench.wrk import WrkResult, run_wrk

QUIET_SECONDS = 0.5
"""After the order rows reached wrk's 202 count: no row added for this long ends the window."""
READY_TIMEOUT = 60.0  # seconds for the consumers to be on the order queues
ORDERS_PATH = "/api/v1/orders"


async def _consumers_on_queues(settings: Settings, consumers: list[Child]) -> None:
    """Wait until every order queue has ``len(consumers)`` consumers.

    Raises:
        BenchError: not within :data:`READY_TIMEOUT` s (or a consumer exited: ServerFailed).
    """
    deadline = time.monotonic() + READY_TIMEOUT
    connection = await aio_pika.connect(settings.amqp.url)
    try:
        channel = await connection.channel()
        while True:
            for consumer in consumers:
                consumer.check_alive()
            counts = []
            for name in settings.amqp.partition_queues():
                queue = await channel.declare_queue(name, passive=True)
                counts.append(queue.declaration_result.consumer_count or 0)
            if min(counts) >= len(consumers):
                return
            if time.monotonic() > deadline:
                raise BenchError(f"consumers on the order queues after {READY_TIMEOUT:.0f}s: {counts}")
            await asyncio.sleep(0.2)
    finally:
        await connection.close()


def _accepted(result: WrkResult) -> int:
    return result.summary["statuses"].get("202", 0)


async def _load(ctx: Context, url: str, name: str, product: int, seconds: float) -> WrkResult:
    """wrk buying ``product`` for ``seconds`` with new buyers; at least one order must be accepted."""
    script, _ = buyers_script(ctx, name, purchase_body(product))
    result = await asyncio.to_thread(run_wrk, url, script, seconds, ctx.options.connections, ctx.options.threads)
    script.unlink()
    if _accepted(result) == 0:
        raise BenchError(f"{name}: no purchase accepted: {result.summary['statuses']} {result.summary['errors']}")
    return result


async def _measure(
    ctx: Context, engine: AsyncEngine, spec: PipelineSpec, index: int, server: tuple[Child, int], round_no: int
) -> Row:
    """One round of the pipeline row ``spec`` on ``server``."""
    child, port = server
    url = f"http://127.0.0.1:{port}{ORDERS_PATH}"
    await purge_orders(ctx.settings)
    env = {**ctx.env, **spec.env}
    consumers = [
        Child(f"{spec.key}-r{round_no}-consumer-{n}", flashsale_argv("consume"), env, ctx.log_dir)
        for n in range(ctx.options.consumers)
    ]
    try:
        await _consumers_on_queues(ctx.settings, consumers)
        warm = pipeline_product(round_no, index, warmup=True)
        warmup = await _load(ctx, url, f"{spec.key}-r{round_no}-w", warm, WARMUP_SECONDS)
        groups = {"server": child.pids(), "consumers": [p for c in consumers for p in process_tree(c.process.pid)]}
        await time_drain(engine, warm, _accepted(warmup), consumers, groups, quiet=QUIET_SECONDS)
        groups |= ctx.stores
        product = pipeline_product(round_no, index)
        start = (time.perf_counter(), CpuSample.take(groups))
        result = await _load(ctx, url, f"{spec.key}-r{round_no}", product, ctx.options.duration)
        drained = await time_drain(
            engine, product, _accepted(result), consumers, groups, start=start, quiet=QUIET_SECONDS
        )
    finally:
        await asyncio.gather(*(consumer.stop() for consumer in consumers))
    return _row(spec, result, drained, await rejected_orders(engine, product))


def _row(spec: PipelineSpec, result: WrkResult, drained: DrainResult, rejected: int) -> Row:
    """The round's row: durable orders per second over the window, wrk's latencies and answers,
    the CPU of every process (wrk's from its rusage) over the window."""
    s = result.summary
    statuses = dict(sorted(s["statuses"].items()))
    accepted = statuses.get("202", 0)
    e = s["errors"]
    note = f"{accepted:,} answered 202 to wrk, {drained.orders:,} orders committed"
    if rejected:
        note += f"; {rejected} written rejected"
    if drained.missing:
        note += f"; {drained.missing} accepted orders never written"
    return Row(
        key=spec.key,
        label=spec.label,
        unit="orders/s",
        rate=round(drained.orders / drained.seconds, 1),
        count=drained.orders,
        seconds=round(drained.seconds, 3),
        reference="pipeline_single" if spec.key != "pipeline_single" else None,
        p50_ms=s["latency_us"]["p50"] / 1000,
        p99_ms=s["latency_us"]["p99"] / 1000,
        statuses=statuses,
        unexpected=sum(statuses.values()) - accepted,
        socket_errors=e["connect"] + e["read"] + e["write"] + e["timeout"],
        cpu={"client": round(result.cpu / drained.seconds, 3), **drained.cpu},
        note=note,
        buyers=buyers_reached(s["requests"], BUYERS),
    )


async def pipeline_rows(ctx: Context, engine: AsyncEngine, cpus: int) -> list[Row]:
    """Start one ``api`` server per wanted row of :data:`PIPELINE_ROWS` (with its environment),
    measure each ``rounds`` times (the rows' order alternating by round), stop the servers; the
    rows with their CPU-seconds per order (``cpus``: the machine's CPUs)."""
    specs = [(n, spec) for n, spec in enumerate(PIPELINE_ROWS) if ctx.options.wants(spec.key)]
    servers: dict[str, tuple[Child, int]] = {}
    measured: dict[str, list[Row]] = {spec.key: [] for _, spec in specs}
    try:
        for _, spec in specs:
            ctx.console.print(f"starting {spec.key} ({ctx.options.workers} granian worker(s))")
            servers[spec.key] = await start_server(ctx, "api", spec.key, spec.env)
        for r in range(ctx.options.rounds):
            for n, spec in specs if r % 2 == 0 else specs[::-1]:
                ctx.console.print(f"round {r + 1}/{ctx.options.rounds}: {spec.label}")
                servers[spec.key][0].check_alive()
                measured[spec.key].append(await _measure(ctx, engine, spec, n, servers[spec.key], r))
    finally:
        for child, _ in servers.values():
            await child.stop()
    rows = [merge_rounds(rounds) for rounds in measured.values()]
    for row in rows:
        fill_cpu_per_order(row, cpus)
    return rows
