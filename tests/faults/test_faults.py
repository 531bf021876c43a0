"""The fault suite (docs/RELIABILITY.md): one small sale per fault, on private servers, with the project's
own processes; the invariants after each (tests/faults/harness.py says what each column
means). ``make faults`` runs them all (about 15 minutes on 2 cores) and writes the table;
``-m faults_ci`` is the subset CI runs (a few minutes).

Each case asserts exactly what a fault may never cost (docs/RELIABILITY.md): 0 lost, 0 duplicate, 0
without a 202, 0 oversold, 0 over the limit, nothing stranded past the bound, recovered by
itself.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.faults.harness import FaultSale
from tests.faults.terms import LIMIT, POISON_STALL_BOUND, READINESS_LIE_BOUND, REPUBLISH_PER_ORDER, monotonic
from tests.servers import PrivateServer

pytestmark = [pytest.mark.faults, pytest.mark.slow]
ci = pytest.mark.faults_ci


async def _steady_start(sale: FaultSale, **processes: bool) -> None:
    await sale.start_all(**processes)
    assert await sale.ready(), f"the API did not become ready: {sale.supervisor.log_text('api')[-2000:]}"


async def _server_down_for(sale: FaultSale, server: PrivateServer, seconds: float) -> None:
    """SIGKILL ``server`` mid-sale, start it again after ``seconds`` (the fault ends when it answers)."""
    await sale.mid_sale()
    sale.faulted()
    await server.kill()
    await asyncio.sleep(seconds)
    await server.start()
    sale.fault_over()


@ci
async def test_api_workers_killed_mid_burst(servers, log_root, record):
    async with FaultSale(servers, "API workers killed -9 mid-burst", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await sale.mid_sale()
        sale.faulted()
        workers = sale.supervisor.children("api")
        assert workers, "no granian workers found"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        sale.fault_over()  # granian starts new workers by itself
        record(await sale.finish())


@ci
async def test_consumer_killed_mid_burst(servers, log_root, record):
    async with FaultSale(servers, "consumer killed -9 mid-burst (restarted as compose does)", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await sale.mid_sale()
        sale.faulted()
        await sale.supervisor.kill("consumer")
        await sale.supervisor.started_again("consumer")
        sale.fault_over()
        record(await sale.finish())


@ci
async def test_redis_killed_and_restarted(servers, log_root, record):
    """Redis killed with SIGKILL for 4 s (AOF everysec: up to a second of writes lost), while
    realign --watch and sweep --watch run."""
    async with FaultSale(servers, "Redis killed -9, back after 4 s (AOF everysec)", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await _server_down_for(sale, servers.redis, 4)
        record(await sale.finish())


@ci
async def test_rabbitmq_down_when_serve_and_consume_start(servers, log_root, record):
    async with FaultSale(servers, "RabbitMQ down when serve and consume start (10 s)", log_root) as sale:
        sale.faulted()
        await servers.rabbitmq.stop()
        await sale.start_all()
        sale.start_load()  # buyers meet 503 unavailable and retry
        await asyncio.sleep(10)
        assert sale.supervisor.running("api") and sale.supervisor.running("consumer")
        await servers.rabbitmq.start()
        sale.fault_over()
        record(await sale.finish())


async def test_redis_down_when_serve_and_consume_start(servers, log_root, record):
    async with FaultSale(servers, "Redis down when serve and consume start (10 s)", log_root) as sale:
        sale.faulted()
        await servers.redis.stop()
        await sale.start_all()
        sale.start_load()
        await asyncio.sleep(10)
        await servers.redis.start()
        sale.fault_over()
        record(await sale.finish())


@pytest.mark.parametrize("realign_watch", [True, False], ids=["realign-watch-running", "no-realign-process"])
async def test_redis_flushall_mid_sale(servers, log_root, record, realign_watch):
    """Redis loses everything mid-sale (FLUSHALL, as a failover to an empty replica would).
    With realign --watch running, no order number may go to two buyers; without any realign
    process, the service must notice the loss and repair it itself (no operator runs realign in a failover).
    Either
    way readiness must say so while purchases cannot succeed."""
    how = "realign --watch running" if realign_watch else "no realign process"
    async with FaultSale(servers, f"Redis FLUSHALL mid-sale ({how})", log_root) as sale:
        await _steady_start(sale, realign=realign_watch)
        sale.start_load()
        await sale.mid_sale()
        sale.faulted()
        await servers.redis.command("FLUSHALL")
        sale.fault_over()
        flushed_at = sale.fault_end

        async def readiness_told() -> str | None:
            lie = sale.readiness_lie(flushed_at)
            return f"readiness 200 for {lie:.1f}s while purchases answered 503" if lie > READINESS_LIE_BOUND else None

        sale.extra_checks.append(readiness_told)
        record(await sale.finish())


async def test_rabbitmq_killed_mid_sale(servers, log_root, record):
    async with FaultSale(servers, "RabbitMQ killed -9, back after 5 s", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await _server_down_for(sale, servers.rabbitmq, 5)
        record(await sale.finish())


async def test_mariadb_killed_for_40_seconds(servers, log_root, record):
    """MariaDB away for 40 s mid-sale (realign --watch and sweep --watch run through it): a
    transient outage must not burn the delivery limit (no order dead-lettered)."""
    async with FaultSale(servers, "MariaDB killed -9 for 40 s", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await _server_down_for(sale, servers.mariadb, 40)
        record(await sale.finish())


async def test_mariadb_and_redis_outages_during_realign_watch(servers, log_root, record):
    """4 s outages of Redis, then MariaDB, while realign --watch 1 and sweep --watch run: both
    keep running (no traceback exit) and realignment resumes by itself."""
    async with FaultSale(servers, "Redis then MariaDB away 4 s each during realign --watch", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await sale.mid_sale()
        sale.faulted()
        for server in (servers.redis, servers.mariadb):
            await server.kill()
            await asyncio.sleep(4)
            await server.start()
            await asyncio.sleep(2)
        sale.fault_over()

        async def watchers_alive() -> str | None:
            down = [name for name in ("realign", "sweep") if not sale.supervisor.running(name)]
            return f"not running: {', '.join(down)}" if down else None

        sale.extra_checks.append(watchers_alive)
        record(await sale.finish())


async def test_poison_flood_mid_sale(servers, log_root, record):
    """100 messages for a product that does not exist (more than the consumer's prefetch of
    64): real orders must not wait more than a few seconds for their rows."""
    async with FaultSale(servers, "100 poison messages (unknown product) mid-sale", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await sale.mid_sale()
        sale.faulted()
        await sale.publish_poison(100)
        sale.fault_over()
        flooded_at = sale.fault_end

        async def not_stalled() -> str | None:
            longest = sale.longest_canary_wait(after=flooded_at)
            if longest is None or longest > POISON_STALL_BOUND:
                return f"orders waited {longest}s for their rows after the flood (bound {POISON_STALL_BOUND:.0f}s)"
            return None

        sale.extra_checks.append(not_stalled)
        record(await sale.finish())


async def test_consumers_lagging(servers, log_root, record):
    """The consumer starts 20 s late with a prefetch of 4 while realign --watch 1 (grace 3 s)
    runs: overdue reservations are re-published once per back-off period, not once per pass,
    and no stale copy stays in the dead-letter queue."""
    async with FaultSale(servers, "consumer started 20 s late, prefetch 4", log_root) as sale:
        await _steady_start(sale, consumer=False)
        sale.faulted()
        began = monotonic()
        sale.start_load()
        await asyncio.sleep(max(0.0, 20 - (monotonic() - began)))
        await sale.start_consumer(prefetch=4)
        sale.fault_over()

        async def republished_once_per_period() -> str | None:
            republished = await sale.republished()
            accepted = len(sale.accepted_order_nos())
            if republished is None:
                return "realign's metrics unreadable"
            if republished > REPUBLISH_PER_ORDER * max(accepted, 1):
                return f"re-published {republished:.0f} messages for {accepted} accepted orders"
            return None

        sale.extra_checks.append(republished_once_per_period)
        record(await sale.finish())


async def test_api_killed_between_reserve_and_publish(servers, log_root, record):
    """The broker freezes (SIGSTOP) mid-sale, so purchases wait for their publisher confirms
    after reserving; then the whole API is killed with SIGKILL, the broker resumes and the API
    comes back (as compose restarts it). No realign process runs: the mechanism that recovers
    stranded reservations must run wherever the API runs (a deployment may run no realign
    process). The reservations
    the dead API left must become orders within the bound, and buyers retrying their key must
    learn them."""
    async with FaultSale(servers, "API killed -9 between reserve and publish (broker frozen)", log_root) as sale:
        await _steady_start(sale, realign=False)
        sale.start_load()
        await sale.mid_sale()
        sale.faulted()
        servers.rabbitmq.pause()
        await asyncio.sleep(2)
        await sale.supervisor.kill("api")
        servers.rabbitmq.resume()
        await sale.supervisor.started_again("api")
        assert await sale.ready()
        sale.fault_over()
        record(await sale.finish())


async def test_quota_key_deleted(servers, log_root, record):
    """Redis loses the per-user quota of buyers who hold the limit (eviction, failover): each
    tries to buy once more; MySQL must keep them at the limit."""
    async with FaultSale(servers, "buyers' quota deleted, then they buy again", log_root) as sale:
        await _steady_start(sale)
        sale.start_load()
        await sale.mid_sale(0.5)
        holders = sale.holders_of_the_limit(30)
        assert holders, "no buyer holds the limit yet"
        sale.faulted()
        await sale.delete_quotas(holders)
        from toolkit.sale.plan import Job, Kind, Shot

        again = [Job(Kind.BUY, (Shot(i, user, 1, f"again-{user}"),)) for i, user in enumerate(holders)]
        await sale.buyers.run(again, concurrency=len(again))
        sale.fault_over()
        sale.notes.append(f"{len(holders)} buyers at the limit of {LIMIT} bought again")
        record(await sale.finish())
