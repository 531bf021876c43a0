"""Process pauses (docs/RELIABILITY.md): one process of the sale stopped with SIGSTOP mid-sale for
longer than every timeout of the deployment, then continued with SIGCONT: an API worker, a
consumer holding unacknowledged deliveries (a second consumer runs beside it), Redis and
MariaDB. A paused process holds its connections open and answers nothing, and then wakes up
believing no time has passed: what it still had in hand must neither be written twice nor
acknowledged for someone else, and the sale must heal by itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable

import pytest

from tests.faults.harness import FaultSale
from tests.faults.terms import PREFETCH, monotonic
from tests.faults.test_faults import _steady_start

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PAUSE_SECONDS = 40.0
"""Longer than every timeout of the deployment: the AMQP heartbeat (10 s; the broker drops a
silent connection within about twice that), the order-number shard lease (30 s), the buyers'
HTTP timeout (30 s), the publisher confirm (5 s), Redis's socket timeout (2 s) and the
realignment grace (3 s)."""


async def _pause(sale: FaultSale, stop: Callable[[], None], wake: Callable[[], None]) -> None:
    """Mid-sale: ``stop()``, :data:`PAUSE_SECONDS` later ``wake()`` (the fault ends then)."""
    await sale.mid_sale()
    sale.faulted()
    stop()
    try:
        await asyncio.sleep(PAUSE_SECONDS)
    finally:
        wake()
    sale.fault_over()


def _signal(pid: int, sig: signal.Signals, group: bool = False) -> None:
    (os.killpg if group else os.kill)(pid, sig)


async def test_api_worker_paused(servers, log_root, record):
    """One of the two granian workers is stopped with requests in hand (reserved, publishing):
    the buyers' requests time out and are retried on the other worker; the stopped worker's
    reservations are published again by realignment; when it wakes, its late answers and
    publishes must not make a second order or lose one."""
    async with FaultSale(servers, f"API worker paused (SIGSTOP {PAUSE_SECONDS:.0f} s)", log_root) as sale:
        await _steady_start(sale)
        workers = sale.supervisor.children("api")
        assert len(workers) >= 2, f"granian workers: {workers}"
        sale.start_load()
        await _pause(sale, lambda: _signal(workers[0], signal.SIGSTOP), lambda: _signal(workers[0], signal.SIGCONT))
        record(await sale.finish())


async def _queue_info(sale: FaultSale) -> dict[str, int]:
    """``messages_unacknowledged`` and ``consumers`` of the sale's order queue, from the broker."""
    done = await sale.servers.rabbitmq.ctl(
        "list_queues", "--quiet", "--formatter", "json", "name", "messages_unacknowledged", "consumers"
    )
    entry = next(e for e in json.loads(done.stdout) if e["name"] == sale.settings.amqp.queue)
    return {"unacked": int(entry["messages_unacknowledged"]), "consumers": int(entry["consumers"])}


async def test_consumer_paused_holding_deliveries(servers, log_root, record):
    """Two consumers; one is stopped while orders flow, so the broker fills its prefetch window
    (the deliveries wait in its socket). The broker must notice it (heartbeat) and hand those
    deliveries to the other consumer, whose rows appear while it is still stopped; when it wakes
    it reads the deliveries it no longer holds: written again they are duplicates (nothing
    written twice), and their acks go to its old, closed connection, never to the new one."""
    fault = f"consumer paused holding deliveries (SIGSTOP {PAUSE_SECONDS:.0f} s)"
    async with FaultSale(servers, fault, log_root) as sale:
        await _steady_start(sale)
        await sale.supervisor.start("consumer-2", "consume", "--prefetch", str(PREFETCH))
        sale.start_load()
        await sale.mid_sale()
        pid = sale.supervisor.pid("consumer")
        assert pid is not None
        sale.faulted()
        paused_at = monotonic()
        _signal(pid, signal.SIGSTOP, group=True)
        try:
            await asyncio.sleep(3)
            held = (await _queue_info(sale))["unacked"]
            await asyncio.sleep(PAUSE_SECONDS - 3)
            before_wake = await _queue_info(sale)
            accepted_before = [
                o.request_id
                for o in sale.buyers.outcomes
                if o is not None and o.code == "accepted" and o.request_id and o.finished < paused_at
            ]
            missing = sorted(set(accepted_before) - await sale.present_request_ids(accepted_before))
            missing_before_wake = len(missing)
        finally:
            _signal(pid, signal.SIGCONT, group=True)
        sale.fault_over()
        sale.notes.append(f"the paused consumer held {held} deliveries")

        async def handed_over() -> str | None:
            problems = []
            if held == 0:
                problems.append("the paused consumer held no deliveries (the case tested nothing)")
            if before_wake["consumers"] != 1:
                problems.append(f"{before_wake['consumers']} consumers before the wake: the stopped one was kept")
            if missing_before_wake:
                problems.append(
                    f"{missing_before_wake} orders accepted before the pause had no row at the wake: {missing[:5]}"
                )
            log = sale.supervisor.log_text("consumer")
            if "PRECONDITION_FAILED" in log or "unknown delivery tag" in log:
                problems.append("the woken consumer acked a delivery tag its channel does not have")
            return "; ".join(problems) or None

        sale.extra_checks.append(handed_over)
        record(await sale.finish())


async def test_redis_paused(servers, log_root, record):
    """Redis stops answering with commands in flight (connections stay open): every purchase times
    out (503) and the buyers retry; on waking Redis runs what was sent to it meanwhile, the
    reservations of requests already answered 503 included."""
    async with FaultSale(servers, f"Redis paused (SIGSTOP {PAUSE_SECONDS:.0f} s)", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await _pause(sale, servers.redis.pause, servers.redis.resume)
        record(await sale.finish())


async def test_mariadb_paused(servers, log_root, record):
    """MariaDB stops answering mid-transaction (connections open, locks held): the consumers'
    batches wait, the API keeps selling from Redis; on waking, every accepted order is written
    once."""
    async with FaultSale(servers, f"MariaDB paused (SIGSTOP {PAUSE_SECONDS:.0f} s)", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await _pause(sale, servers.mariadb.pause, servers.mariadb.resume)
        record(await sale.finish())
