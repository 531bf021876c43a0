"""Helpers shared by the tests: the one place tests import shared code from.

Nothing here connects anywhere by itself; the integration fixtures (``tests/integration/conftest.py``)
hand in the engine, Redis client, AMQP channel and settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from litestar import Litestar
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.consume import consuming
from consumers.order_consumer import OrderConsumer
from db.engine import make_engine
from db.models import OrderStatus
from service.adapters.broker_topology import delete_topology
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.stores import RedisStores
from service.api.app import create_app
from service.bootstrap import open_api
from service.domain.order_numbers.format import compose_order_no
from service.domain.payments.notification import sign
from service.domain.purchase.answers import PurchaseRejected
from service.domain.purchase.request_id import mint_request_id
from service.failures import ER_LOCK_WAIT_TIMEOUT, mysql_errno
from service.model.order_message import OrderMessage
from service.settings import Settings
from tests.servers import PrivateMariaDB, PrivateRabbitMQ, PrivateRedis, private_server, scratch  # noqa: F401
from toolkit.sale.isolation import environment, free_port

# How long a test waits for something that will happen (a row written, a queue drained, a
# process ready) before failing. Generous on purpose: it bounds a wait for a condition, it is not
# a delay, so a busy machine makes a test slower, never wrong.
PATIENCE = 60.0


def start_serve(settings: Settings, port: int, workers: int = 1) -> subprocess.Popen:
    """``flashsale serve`` on ``port`` with ``workers`` granian workers, reading exactly ``settings``,
    in a session of its own (stop it with ``os.killpg(process.pid, ...)``), output discarded."""
    env = {**os.environ, **environment(settings)}
    return start_flashsale(["serve", "--port", str(port), "--workers", str(workers)], env)


async def eventually(check, timeout: float = PATIENCE, interval: float = 0.05):
    """Poll the async ``check`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {result!r})")
        await asyncio.sleep(interval)


async def buy(client, headers, product_id, quantity=1, key=None):
    if key is not None:
        headers = {**headers, "Idempotency-Key": key}
    return await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": quantity}, headers=headers)


async def order_rows(engine: AsyncEngine, product_id: int) -> list:
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                text(
                    "SELECT order_no, request_id, user_id, quantity, status, reason FROM orders WHERE product_id = :p"
                ),
                {"p": product_id},
            )
        )


async def rows_at_least(engine: AsyncEngine, product_id: int, count: int) -> bool:
    return len(await order_rows(engine, product_id)) >= count


async def rows_are(engine: AsyncEngine, product_id: int, count: int) -> bool:
    """Exactly ``count`` order rows of ``product_id`` (for :func:`eventually`)."""
    return len(await order_rows(engine, product_id)) == count


async def inventory(engine: AsyncEngine, product_id: int) -> tuple[int, int]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(text("SELECT stock, sold FROM inventory WHERE product_id = :p"), {"p": product_id})
        ).one()
        return row.stock, row.sold


async def quota_rows(engine: AsyncEngine, product_id: int) -> dict[str, int]:
    """MySQL's count of units per user against product ``product_id``'s per-user limit (``user_quota``)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT user_id, bought FROM user_quota WHERE product_id = :p"), {"p": product_id}
        )
        return {row.user_id: row.bought for row in rows}


async def redis_state(redis: Redis, settings: Settings, product_id: int) -> dict:
    """Everything Redis holds for a product (for "left no trace" assertions)."""
    keys = ProductKeys(settings.redis.key_prefix, product_id)
    found = sorted([key async for key in redis.scan_iter(match=f"{keys.tag}:*", count=1000)])
    return {
        "keys": found,
        "stock": await redis.get(keys.stock),
        "journal": await redis.hgetall(keys.journal),
        "quota": await redis.hgetall(keys.quota),
    }


class RedisSnapshot:
    """Every key of a product's slot as it is now (``DUMP`` with its time to live); :meth:`restore`
    puts the slot back to exactly that, as a Redis restarted from an older RDB file would (keys
    written since are gone, keys changed since are old again)."""

    def __init__(self, redis: Redis, settings: Settings, product_id: int) -> None:
        self._redis = redis
        self._match = f"{ProductKeys(settings.redis.key_prefix, product_id).tag}:*"
        self._dumps: dict[str, tuple[bytes, int]] = {}

    async def take(self) -> RedisSnapshot:
        async for key in self._redis.scan_iter(match=self._match, count=1000):
            dump, ttl = await self._redis.dump(key), await self._redis.pttl(key)
            if dump is not None:
                self._dumps[key] = (dump, max(ttl, 0))
        return self

    async def restore(self) -> None:
        async for key in self._redis.scan_iter(match=self._match, count=1000):
            await self._redis.delete(key)
        for key, (dump, ttl) in self._dumps.items():
            await self._redis.restore(key, ttl, dump, replace=True)


async def behind_a_row_lock(settings: Settings, engine: AsyncEngine, product_id: int, work) -> tuple[object, int]:
    """Run ``work(impatient)`` while another transaction holds product ``product_id``'s inventory
    row lock; ``impatient`` is an engine whose sessions give up a lock wait after 1 s (1205). The
    lock is released once a statement of ``work`` has failed with 1205 (seen by the engine's
    ``handle_error`` event, not by log capture: loggers cached by earlier tests escape it).
    Returns ``work``'s result and how many 1205s its statements met."""
    impatient = make_engine(settings.db.url, pool_size=2, max_overflow=settings.db.max_overflow)
    timeouts: list[int] = []

    def short_lock_wait(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        cursor.close()

    def count_timeouts(context) -> None:
        if mysql_errno(context.sqlalchemy_exception) == ER_LOCK_WAIT_TIMEOUT:
            timeouts.append(1)

    event.listen(impatient.sync_engine, "connect", short_lock_wait)
    event.listen(impatient.sync_engine, "handle_error", count_timeouts)
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold_row_lock():
        async with engine.begin() as conn:
            await conn.execute(text("SELECT stock FROM inventory WHERE product_id = :p FOR UPDATE"), {"p": product_id})
            holding.set()
            await release.wait()

    async def timed_out() -> bool:
        return bool(timeouts)

    blocker = asyncio.create_task(hold_row_lock())
    try:
        await holding.wait()
        running = asyncio.create_task(work(impatient))
        await eventually(timed_out)
        release.set()
        await blocker
        result = await running
    finally:
        release.set()
        await impatient.dispose()
    return result, len(timeouts)


async def publish_raw(channel, settings, body: bytes, message_id: str = "x", partition: int = 0) -> None:
    """``body`` on the order exchange, routed to ``partition``'s order queue (the only one by default)."""
    exchange = await channel.get_exchange(settings.amqp.exchange)
    await exchange.publish(
        aio_pika.Message(body, message_id=message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key=settings.amqp.partition_queue(partition),
    )


def message_for(product_id: int, user: str, sequence: int, quantity: int = 1) -> OrderMessage:
    order_no = compose_order_no("FS", "20261130000000", 99, sequence)
    return OrderMessage(mint_request_id(), order_no, user, product_id, quantity, 0, 1500 * quantity)


@contextlib.asynccontextmanager
async def sampling_min_stock(redis: Redis, key: str, interval: float = 0.001):
    """Samples a stock key while the block runs; yields a list whose [0] becomes the minimum seen."""
    seen: list[int] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            value = await redis.get(key)
            if value is not None:
                seen.append(int(value))
            await asyncio.sleep(interval)

    task = asyncio.create_task(sample())
    result: list[int] = []
    try:
        yield result
    finally:
        stop.set()
        await task
        result.append(min(seen) if seen else 0)


class RunsAfterJournalRead:
    """The real Redis client, except that right after the realigner reads a product's journal,
    ``during_read`` runs (real consumers commit, another pass runs, an operator changes the
    product): the races of realignment, made to happen at their worst moment. Everything goes to
    the real Redis and MySQL."""

    def __init__(self, redis: Redis, during_read) -> None:
        self._redis = redis
        self._during_read = during_read

    def __getattr__(self, name: str):
        return getattr(self._redis, name)

    async def hscan_iter(self, key: str, **options):
        async for item in self._redis.hscan_iter(key, **options):
            yield item
        await self._during_read()


@contextlib.asynccontextmanager
async def serving(app: Litestar, timeout: float = 30) -> AsyncIterator[httpx.AsyncClient]:
    """``app`` (its lifespan run) behind an httpx client in the test's own event loop: requests
    gathered on it really run concurrently, as in one API worker. (Litestar's ``AsyncTestClient``
    runs the app in a portal thread and blocks the loop for each request, so its gathered
    requests run one after another.) The lifespan runs in a task of its own, entered and left
    there: pytest-asyncio sets a fixture up and tears it down in different tasks, and Litestar's
    lifespan holds an anyio cancel scope that must be left in the task that entered it."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def run_lifespan() -> None:
        async with app.lifespan():
            started.set()
            await stop.wait()

    lifespan = asyncio.create_task(run_lifespan())
    waiting = asyncio.create_task(started.wait())
    await asyncio.wait({lifespan, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if lifespan.done():
        waiting.cancel()
        lifespan.result()  # start-up failed: raise its error here
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", timeout=timeout) as client:
            yield client
    finally:
        stop.set()
        await lifespan


@contextlib.asynccontextmanager
async def api_in_loop(settings: Settings, pool_size: int = 10) -> AsyncIterator[httpx.AsyncClient]:
    """The API app on ``settings`` with a MySQL pool of ``pool_size`` (+ 5), :func:`serving`."""
    db = settings.db.model_copy(update={"pool_size": pool_size, "max_overflow": 5})
    async with serving(create_app(settings.model_copy(update={"db": db})), timeout=60) as client:
        yield client


@contextlib.asynccontextmanager
async def running_consumer(settings: Settings, engine: AsyncEngine, store: RedisStores) -> AsyncIterator[OrderConsumer]:
    """An in-process consumer on the run's queue while the block runs (the real one, prefetch 32);
    it drains what it holds on exit."""
    order_consumer = OrderConsumer(engine, store)
    async with consuming(settings.amqp, order_consumer, prefetch=32):
        yield order_consumer


@contextlib.asynccontextmanager
async def own_queues(settings: Settings, name: str, **amqp_settings: Any) -> AsyncIterator[Settings]:
    """``settings`` with an order exchange, queue, dead-letter exchange and queue of their own
    (``<queue>-<name>...``), and ``amqp_settings`` (such as ``retry_delays`` or ``partitions``),
    deleted on exit with every partition's queue and retry queues: for tests that count what lands
    in a queue, so late messages of earlier tests (still in their retry backoff) cannot land in
    their counts."""
    amqp = settings.amqp
    mine = amqp.model_copy(
        update={
            "exchange": f"{amqp.exchange}-{name}",
            "queue": f"{amqp.queue}-{name}",
            "dead_letter_exchange": f"{amqp.dead_letter_exchange}-{name}",
            "dead_letter_queue": f"{amqp.dead_letter_queue}-{name}",
            **amqp_settings,
        }
    )
    try:
        yield settings.model_copy(update={"amqp": mine})
    finally:
        await delete_topology(mine.model_copy(update={"url": amqp.url, "failover_urls": amqp.failover_urls}))


class ReplySwallowingProxy:
    """A TCP proxy in front of the real Redis that forwards everything but, while ``armed``,
    swallows the reply to the first EVALSHA naming ``marker`` (a user id) and drops that
    connection: the script ran in Redis, the client never heard back. Then it disarms itself."""

    def __init__(self, upstream_host: str, upstream_port: int, marker: bytes = b"victim", armed: bool = True) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._marker = marker
        self.armed = armed
        self.swallowed = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._upstream)
        swallow = asyncio.Event()

        async def client_to_server():
            while data := await client_reader.read(65536):
                if self.armed and b"EVALSHA" in data.upper() and self._marker in data:
                    self.armed = False
                    swallow.set()
                server_writer.write(data)
                await server_writer.drain()

        async def server_to_client():
            while data := await server_reader.read(65536):
                if swallow.is_set():
                    self.swallowed += 1
                    return  # the script ran; its reply never arrives, the connection drops
                client_writer.write(data)
                await client_writer.drain()

        tasks = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_writer, server_writer):
            writer.close()


@contextlib.asynccontextmanager
async def private_redis() -> AsyncIterator[str]:
    """A Redis server of the test's own (``redis-server`` on a free port, nothing saved), for
    what must not be done to the shared one (SCRIPT FLUSH, CLIENT KILL); yields its URL and
    stops it (by its PID) on exit."""
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        probe = Redis.from_url(url)
        try:

            async def answers() -> bool:
                try:
                    return bool(await probe.ping())
                except (OSError, RedisError):
                    return False

            await eventually(answers, timeout=10)
        finally:
            await probe.aclose()
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


class PausableProxy:
    """A TCP proxy in front of ``upstream`` (host, port) whose forwarding can be paused: while
    :attr:`paused` is set, bytes are held back in both directions (a stalled server, as seen by
    the client); clearing it lets them through again. :meth:`stall_open_connections` holds back
    only the connections open at the call (a stalled connection; later ones work) until
    :meth:`release`. It runs on an event loop of its own in a thread, so it keeps serving while
    the test's loop is blocked (Litestar's test client runs the app's lifespan synchronously)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self.paused = False
        self._opened = 0
        self._stalled = 0  # connections numbered below this are held back
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pausable-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop)
        self._server = await asyncio.wrap_future(started)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(shut(), self._loop))
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, 10)

    def stall_open_connections(self) -> None:
        """Hold back the bytes of every connection open now, both ways, until :meth:`release`."""
        self._stalled = self._opened

    def release(self) -> None:
        """Let the stalled connections' bytes through again."""
        self._stalled = 0

    async def _pipe(self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.paused or number < self._stalled:
                    await asyncio.sleep(0.01)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        number, self._opened = self._opened, self._opened + 1
        server_reader, server_writer = await asyncio.open_connection(*self._upstream)
        await asyncio.gather(
            self._pipe(number, client_reader, server_writer),
            self._pipe(number, server_reader, client_writer),
            return_exceptions=True,
        )


async def buy_losing_the_reserve_reply(
    settings: Settings, watcher: ReplySwallowingProxy, port: int, product_id: int, request_id: str
) -> None:
    """``victim`` buys through the proxy on ``port``, armed to swallow the reserve's reply: the
    answer is 503 ``unavailable`` (the script ran in Redis; what it left is for the caller to check)."""
    through = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"url": f"redis://127.0.0.1:{port}/0"})}
    )
    watcher.armed = True
    resources = await open_api(through)
    try:
        with pytest.raises(PurchaseRejected) as rejected:
            await resources.purchases.purchase("victim", product_id, 1, request_id)
    finally:
        await resources.close()
    assert rejected.value.code == "unavailable"
    assert watcher.swallowed == 1


async def buy_and_settle(client, token, engine, product_id: int, users: list[str], quantity: int = 1) -> list[str]:
    """Buy once per user through the API and wait until every order is in MySQL; order numbers."""
    responses = await asyncio.gather(
        *(
            client.post("/api/v1/orders", json={"product_id": product_id, "quantity": quantity}, headers=token(u))
            for u in users
        )
    )
    assert all(r.status_code == 202 for r in responses), [r.text for r in responses if r.status_code != 202]

    order_nos = [r.json()["order_no"] for r in responses]

    async def all_written():
        return set(order_nos) <= {row.order_no for row in await order_rows(engine, product_id)}

    await eventually(all_written)
    return order_nos


def notification(
    settings: Settings,
    order_no: str,
    amount: int = 1500,
    txn: str = "t1",
    event: str = "paid",
    channel: str = "mockpay",
    **extra,
) -> tuple[bytes, dict]:
    """The raw body and headers of ``channel``'s signed notification (``extra``: more fields)."""
    body = json.dumps(
        {
            "channel": channel,
            "channel_txn_id": txn,
            "order_no": order_no,
            "amount": amount,
            "currency": settings.payment.currency,
            "event": event,
            **extra,
        }
    ).encode()
    secret = settings.payment.channel_secrets[channel]
    return body, {"content-type": "application/json", "X-Signature": sign(secret, body)}


async def notify(client, settings: Settings, order_no: str, **kwargs):
    """POST :func:`notification` to the API's notify route."""
    body, headers = notification(settings, order_no, **kwargs)
    return await client.post("/api/v1/payments/notify", content=body, headers=headers)


async def status_of(engine: AsyncEngine, order_no: str) -> OrderStatus:
    async with engine.connect() as conn:
        status = (await conn.execute(text("SELECT status FROM orders WHERE order_no = :o"), {"o": order_no})).scalar()
    return OrderStatus(status)


async def payments_of(engine: AsyncEngine, order_no: str) -> list:
    """Order ``order_no``'s payments rows, oldest first."""
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                text(
                    "SELECT channel, channel_txn_id, event, status, flagged, idem_key FROM payments"
                    " WHERE order_no = :o ORDER BY id"
                ),
                {"o": order_no},
            )
        )


@contextlib.asynccontextmanager
async def flashsale_process(
    settings: Settings, ready_url: str, *args: str, log: Path | None = None
) -> AsyncIterator[subprocess.Popen]:
    """``flashsale ARGS`` as a subprocess reading ``settings`` (its own process group), once
    ``ready_url`` answers 200; SIGTERM on exit (SIGKILL after 20 s). Its output goes to ``log``
    (kept; default a temporary file, removed). When the block fails, the failure carries the
    last lines the process printed."""
    if log is None:
        with tempfile.NamedTemporaryFile(prefix="flashsale-", suffix=".log", delete=False) as temporary:
            output = Path(temporary.name)
    else:
        output = log
    process = start_flashsale(list(args), {**os.environ, **environment(settings)}, output)

    async def ready():
        assert process.poll() is None, f"flashsale {' '.join(args)} exited {process.returncode}"
        try:
            async with httpx.AsyncClient() as http:
                return (await http.get(ready_url)).status_code == 200
        except httpx.HTTPError:
            return False

    failure: BaseException | None = None
    try:
        await eventually(ready, interval=0.2)
        yield process
    except BaseException as exc:
        failure = exc
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
        if failure is not None:
            lines = (await asyncio.to_thread(output.read_text, errors="replace")).splitlines()[-40:]
            failure.add_note(f"flashsale {' '.join(args)} printed (last {len(lines)} lines):\n" + "\n".join(lines))
        if log is None:
            await asyncio.to_thread(output.unlink, missing_ok=True)


def run_flashsale(settings: Settings, *argv: str, answer: str = "") -> subprocess.CompletedProcess[str]:
    """``flashsale ARGV`` run to its end reading ``settings`` (``answer`` on its stdin); its output
    captured as text. At most 60 s."""
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    env = {**os.environ, **environment(settings)}
    return subprocess.run(
        [flashsale, *argv], env=env, input=answer, capture_output=True, text=True, timeout=60, check=False
    )


def start_flashsale(argv: list[str], env: dict[str, str], log=None) -> subprocess.Popen:
    """``flashsale ARGV`` in a session of its own (stop it with ``os.killpg``), output to the file
    ``log`` (discarded when None)."""
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    if log is None:
        return subprocess.Popen(
            [flashsale, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
    with open(log, "wb") as out:
        return subprocess.Popen(
            [flashsale, *argv], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


async def api_ready(http) -> bool:
    """True when the API behind the httpx client ``http`` answers its readiness probe with 200."""
    try:
        return (await http.get("/api/v1/health/ready")).status_code == 200
    except httpx.HTTPError:
        return False
