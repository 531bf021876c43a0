"""Prometheus metrics of every flashsale process (prometheus_client), and their exposition.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set (``flashsale serve`` sets it for its
granian workers) every process writes its values to files there and any one of them exposes the
sum (:func:`exposition`). Without it each process keeps its values in memory and exposes its own.

The purchase path pays almost nothing per request: its observations go to :class:`LocalCounter`
and :class:`LocalHistogram` (plain integer and float additions on the event loop, children
made once per label set), and :func:`flush` hands the sums to prometheus_client once a second
(:func:`flushing`). In multiprocess mode one prometheus_client update is a locked write to a
memory-mapped file (about 2.5 us for a counter, 5 us for a histogram on the machines measured),
which would cost the cheapest routes several per cent. The other processes (consumer,
realignment, sweep) observe per batch or per pass and use prometheus_client directly.

Names follow the Prometheus conventions (``flashsale_`` prefix, base units, ``_total`` for
counters); label values are bounded: route templates, status codes, outcome codes, script names,
queue roles and product ids (a catalogue's size), never user ids or order numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as _multiprocess
from prometheus_client.registry import REGISTRY

from service.runtime import stop_task

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
FLUSH_SECONDS = 1.0
"""How often the purchase path's local sums reach prometheus_client (the lag a scrape may see)."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Latency buckets in seconds: the purchase path answers in well under a millisecond when idle
# and in tens of milliseconds under a stampede.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)
_WAIT_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)

# -- API processes ----------------------------------------------------------------------------
HTTP_REQUEST_SECONDS = Histogram(
    "flashsale_http_request_duration_seconds",
    "Time to answer an HTTP request, by method, route template and status (its _count is the request rate).",
    ["method", "route", "status"],
    buckets=_LATENCY_BUCKETS,
)
PURCHASE_OUTCOMES = Counter(
    "flashsale_purchase_outcomes_total",
    "Purchase answers by code (accepted or the problem code); answered_by=sold_out_flag counts the "
    "requests the process's sold-out flag answered without asking Redis.",
    ["code", "answered_by"],
)
REDIS_SCRIPT_SECONDS = Histogram(
    "flashsale_redis_script_duration_seconds",
    "Round trip of one Redis script call on the purchase path, by script.",
    ["script"],
    buckets=_LATENCY_BUCKETS,
)
PUBLISH_CONFIRM_SECONDS = Histogram(
    "flashsale_publish_confirm_duration_seconds",
    "Time from publishing an order message to the broker's confirm (successful publishes; for a"
    " purchase in a group, until its mark-queued writes after the confirm are done too).",
    buckets=_LATENCY_BUCKETS,
)
PUBLISH_FAILURES = Counter(
    "flashsale_publish_failures_total", "Order messages the broker did not confirm (nack, timeout, down)."
)
RELEASES = Counter(
    "flashsale_reservation_releases_total",
    "Reservations an HTTP attempt gave back after a failed reserve or publish, by release outcome.",
    ["outcome"],
)

# -- every process ----------------------------------------------------------------------------
TRANSACTION_RETRIES_BY_WORK = Counter(
    "flashsale_transaction_retries_total",
    "MySQL transactions retried after a deadlock or lock wait timeout, by work (buy_in_database, "
    "write_orders, mint_order_no, set_stock_mode, set_product), counted by the use case that runs "
    "the transaction, so every process and entry point counts its own.",
    ["work"],
)

# -- consumer ---------------------------------------------------------------------------------
CONSUMER_MESSAGES = Counter(
    "flashsale_consumer_messages_total",
    "Order messages settled by the consumer, by outcome (applied, rejected, duplicate, released, "
    "unknown_product, conflict, invalid, failed; then retried or dead_lettered).",
    ["outcome"],
)
TRANSACTION_RETRIES = Counter(
    "flashsale_consumer_transaction_retries_total", "Batch transactions retried after a deadlock or lock wait timeout."
)
BATCH_SIZE = Histogram(
    "flashsale_consumer_batch_size_orders", "Orders written in one MySQL transaction.", buckets=_BATCH_BUCKETS
)
RESERVATION_TO_ROW_SECONDS = Histogram(
    "flashsale_reservation_to_row_seconds",
    "Time from the reservation in Redis to its order row committed in MySQL.",
    buckets=_DELAY_BUCKETS,
)
QUEUE_DEPTH = Gauge(
    "flashsale_queue_depth_messages",
    "Messages ready in a queue (queue=orders, retry: all retry queues together, or dead_letter), sampled by the "
    "consumer.",
    ["queue"],
    multiprocess_mode="mostrecent",
)

# -- waiting rooms (API processes; docs/ARCHITECTURE.md, "Waiting room") --------------------------
WAITING_ROOM_WAITING = Gauge(
    "flashsale_waiting_room_waiting_buyers",
    "Buyers in a product's waiting-room line who have not departed, as the latest join or poll saw it.",
    ["product_id"],
    multiprocess_mode="mostrecent",
)
WAITING_ROOM_OUTSTANDING = Gauge(
    "flashsale_waiting_room_admissions_outstanding",
    "Admission tokens handed out and neither used nor expired, as the latest join, poll or purchase saw it.",
    ["product_id"],
    multiprocess_mode="mostrecent",
)
WAITING_ROOM_HELD = Gauge(
    "flashsale_waiting_room_units_held",
    "Units kept for admitted buyers (not sold), as the latest join, poll or purchase saw it.",
    ["product_id"],
    multiprocess_mode="mostrecent",
)
WAITING_ROOM_ADMISSIONS = Counter(
    "flashsale_waiting_room_admissions_total",
    "Buyers admitted from a product's waiting room (rate(): admissions per second).",
    ["product_id"],
)
WAITING_ROOM_EXPIRED = Counter(
    "flashsale_waiting_room_admissions_expired_total",
    "Admission tokens that expired unused (their places went to the next in line).",
    ["product_id"],
)
WAITING_ROOM_WAIT_SECONDS = Histogram(
    "flashsale_waiting_room_wait_seconds",
    "Time a buyer waited in line until admitted (the pre-queue from the opening); histogram_quantile for p50/p99.",
    ["product_id"],
    buckets=_WAIT_BUCKETS,
)

# -- realignment and sweep --------------------------------------------------------------------
REALIGN_DRIFT = Gauge(
    "flashsale_realign_drift_units",
    "Redis stock minus the stock realignment computed, at the product's last pass (0 when aligned).",
    ["product_id"],
    multiprocess_mode="mostrecent",
)
REALIGN_IN_FLIGHT = Gauge(
    "flashsale_realign_in_flight_units",
    "Units reserved in Redis that MySQL had not resolved, at the product's last pass.",
    ["product_id"],
    multiprocess_mode="mostrecent",
)
REALIGN_REPUBLISHED = Counter(
    "flashsale_realign_republished_total",
    "Overdue reservations realignment published again, by product.",
    ["product_id"],
)
SWEPT = Counter("flashsale_sweep_cancelled_total", "Orders cancelled by the sweep after the payment window.")


class LocalCounter:
    """A counter child's increments summed on the event loop until :func:`flush`.
    Not thread-safe: call from the event loop thread only."""

    __slots__ = ("_child", "pending")

    def __init__(self, child: Counter) -> None:
        self._child = child
        self.pending = 0

    def inc(self, amount: int = 1) -> None:
        """Count ``amount`` (one by default)."""
        self.pending += amount

    def flush(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, 0
            self._child.inc(pending)


class LocalHistogram:
    """A histogram child's observations binned on the event loop until :func:`flush`.
    Not thread-safe: call from the event loop thread only."""

    __slots__ = ("_bounds", "_child", "counts", "total")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        self._bounds: Sequence[float] = child._upper_bounds  # sorted, ends with +Inf
        self.counts = [0] * len(self._bounds)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Observe ``value`` (the family's unit, seconds or orders)."""
        self.counts[bisect_left(self._bounds, value)] += 1
        self.total += value

    def flush(self) -> None:
        if not any(self.counts):
            return
        # prometheus_client has no public call to add many observations at once; these are the
        # values observe() itself updates (tests/unit/test_metrics.py checks the exposition).
        child = self._child
        for index, count in enumerate(self.counts):
            if count:
                child._buckets[index].inc(count)
                self.counts[index] = 0
        total, self.total = self.total, 0.0
        child._sum.inc(total)


_locals: list[LocalCounter | LocalHistogram] = []
_counters: dict[tuple[Counter, tuple[str, ...]], LocalCounter] = {}


def local_counter(family: Counter, *labels: str) -> LocalCounter:
    """The :class:`LocalCounter` of ``family``'s child with ``labels``: made on the first call,
    the same one on every later call (so a label value known only at run time, such as an
    outcome, costs one dictionary look-up per count)."""
    key = (family, labels)
    local = _counters.get(key)
    if local is None:
        local = _counters[key] = LocalCounter(family.labels(*labels) if labels else family)
        _locals.append(local)
    return local


def local_histogram(family: Histogram, *labels: str) -> LocalHistogram:
    """The :class:`LocalHistogram` of ``family``'s child with ``labels`` (make it once, keep it)."""
    local = LocalHistogram(family.labels(*labels) if labels else family)
    _locals.append(local)
    return local


def purchase_outcome(code: str, answered_by: str = "redis") -> LocalCounter:
    """The local counter of purchase answers with ``code`` (``accepted`` or a domain error code),
    answered by Redis or by the process's ``sold_out_flag``."""
    return local_counter(PURCHASE_OUTCOMES, code, answered_by)


def retry_counter(work: str, *also: Callable[[], None]) -> Callable[[], None]:
    """The ``on_retry`` of :func:`db.engine.in_transaction` for the transactions of ``work`` (a
    fixed name: a label value): one more in ``flashsale_transaction_retries_total{work}``, then
    each of ``also``."""
    child = TRANSACTION_RETRIES_BY_WORK.labels(work)

    def retried() -> None:
        child.inc()
        for call in also:
            call()

    return retried


def flush() -> None:
    """Hand every local sum of this process to prometheus_client."""
    for local in _locals:
        local.flush()


@contextlib.asynccontextmanager
async def flushing(seconds: float = FLUSH_SECONDS) -> AsyncIterator[None]:
    """Flush every ``seconds`` while the block runs, and once more on exit."""
    async with every(seconds, flush):
        yield


@contextlib.asynccontextmanager
async def every(seconds: float, call: Callable[[], None]) -> AsyncIterator[None]:
    """``call()`` every ``seconds`` while the block runs (on the event loop), and once more on exit."""

    async def repeat() -> None:
        while True:
            await asyncio.sleep(seconds)
            call()

    task = asyncio.create_task(repeat())
    try:
        yield
    finally:
        await stop_task(task)
        call()


def multiprocess() -> bool:
    """True when this process writes its values to ``PROMETHEUS_MULTIPROC_DIR``."""
    return bool(os.environ.get(MULTIPROC_ENV))


def registry() -> CollectorRegistry:
    """What ``/metrics`` exposes: every process's values in multiprocess mode, else this process's."""
    if not multiprocess():
        return REGISTRY
    collected = CollectorRegistry()
    _multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    return collected


def exposition() -> bytes:
    """The Prometheus text format of :func:`registry` (reads files in multiprocess mode: call it
    off the event loop, after :func:`flush` on it)."""
    return generate_latest(registry())


def process_exited(pid: int) -> None:
    """In multiprocess mode, drop the live-gauge files of a process that exited (its counters and
    histograms stay: they are part of the totals)."""
    if multiprocess():
        _multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


@contextlib.asynccontextmanager
async def exposed(port: int | None, host: str) -> AsyncIterator[None]:
    """For the consumer, realignment and sweep processes (the API serves ``/metrics`` itself):
    local sums flushed while the block runs and, with a ``port``, :func:`registry` served on
    ``http://host:port/metrics`` by prometheus_client's server (a daemon thread)."""
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=registry())
    async with flushing():
        yield
    process_exited(os.getpid())
