"""``flashsale sale``: a whole flash sale end to end on the real services, every invariant checked.

Phases: isolate, start the API and the consumers, create the product, measure the framework
ceiling (the no-op wave), send the purchase load, wait for the queue to drain, with
``--pay-share`` run the order lifecycle, realign, read the stores, check the invariants
(:mod:`service.sale.report`), report, stop the processes and clean up.

Framework ceiling (``--noop-requests N``, 0 = off). Before the purchase load, ``POST
/api/v1/bench/noop`` (``FLASHSALE_BENCH_ROUTES=true``: JWT auth and body decoding, nothing else)
gets N requests built like the purchases (same JWTs, bodies, mix, concurrency and clients, one
code path: :func:`send_wave`). The report puts its throughput and latency next to the purchase
load's, with the ratios. When the route answers 404 (an API started without the bench routes,
``--url``) the wave is skipped and the report says so.

Order lifecycle (``--pay-share S``, isolated runs only). The API and the consumers get
``FLASHSALE_PAYMENT__WINDOW_SECONDS`` = ``--payment-window``. After the first drain a share S of
the orders pending payment (chosen at random, seeded by the run id) get a signed ``paid``
notification, as a payment channel sends it (:func:`notification`), a bounded number at a time;
the others are left until every one of them is older than the window in MySQL's clock, then the
payment-timeout sweep runs once, in this process (:func:`service.domain.lifecycle.expire_unpaid` with
the run's settings: the same code ``flashsale sweep`` runs, counted exactly). Then a resale wave:
new buyers send :data:`RESALE_FACTOR` times as many requests as units are on sale again (at least
:data:`RESALE_MIN_REQUESTS`), the queue drains a second time, and the realignment follows.

Isolation (default). The run gets an id ``sale_<8 hex>`` and settings of its own derived from
the given ones: database ``<run id>`` on the same MySQL server (created by
``db.migrate.upgrade``), Redis key prefix ``<run id>``, AMQP exchange, queue and dead-letter
names ``<run id>.orders...`` and a random JWT secret. The API (``flashsale serve`` on a free
port) and the consumers (``flashsale consume``) get these through ``FLASHSALE_*`` environment
variables. At the end, success or failure, the processes are stopped (SIGTERM, then SIGKILL
after a timeout) and the database, the Redis keys under the prefix and the queues and exchanges
are removed. Nothing outside the run is touched.

``--url``. The API is already running, so its database, Redis prefix and queues are whatever it
uses; the settings as given must be the same (the admin token is signed with
``settings.auth.jwt_secret``). The sale creates a product with a random id in [10^9, 2*10^9)
through the admin route and still starts ``consumers`` consumer processes with those settings:
competing with consumers already attached to the queue is safe (the unique request id makes
every order exactly-once) and guarantees the queue drains. Only that product's rows and keys and
the dead letters added during the run are checked; nothing is cleaned up (the product and its
orders stay, as any sale's would).

Exit status: 0 when every invariant holds, 1 when one fails, 2 when the sale could not be set up
(a service unreachable, the API not ready, the product not created), 130 when interrupted
(SIGINT or SIGTERM; the clean-up still runs). Subprocess logs go to a temporary directory,
removed after a clean run and printed otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aio_pika
import httpx
import msgspec
from aio_pika.abc import AbstractChannel
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from db.migrate import upgrade
from db.models import OrderStatus
from service.adapters.broker import declare_topology, queue_depth
from service.adapters.redis.stock_store import StockStore
from service.api.auth import issue_token
from service.bootstrap import make_store
from service.cli.realign import open_realigner
from service.domain.lifecycle import expire_unpaid
from service.domain.payments import Notification, signed
from service.domain.realign import RealignReport
from service.log_setup import configure_logging
from service.sale.isolation import environment, free_port, isolated_settings, tear_down
from service.sale.load import (
    REQUEST_TIMEOUT,
    LoadGenerator,
    build_plan,
    build_requests,
    load_clients,
    progress_bar,
)
from service.sale.report import (
    ACCEPTED,
    Job,
    Kind,
    LifecycleRun,
    Measured,
    OrderRow,
    PaymentRow,
    Shot,
    StoreFacts,
    Wave,
    build_report,
    render,
)
from service.settings import Settings

T = TypeVar("T")

PRICE = 9900  # minor currency units
READY_TIMEOUT = 60.0  # seconds for a started API to answer /health/ready (--url: CONNECT_TIMEOUT)
CONNECT_TIMEOUT = 10.0  # seconds for each service to answer at set-up
DRAIN_TIMEOUT = 180.0  # seconds for the queue to drain after the last answer
DRAIN_POLL = 0.2  # seconds between drain polls
DRAINED_POLLS = 3  # consecutive polls that must see the queue drained
STOP_TIMEOUT = 30.0  # seconds a process gets after SIGTERM before SIGKILL
PAY_CONCURRENCY = 32  # notifications in flight at most (each row-locks an order in one API transaction)
WINDOW_MARGIN = 0.2  # seconds slept past the moment MySQL's clock puts the last unpaid order beyond the window
RESALE_FACTOR = 3  # resale requests per unit on sale again, so demand exceeds supply
RESALE_MIN_REQUESTS = 50

ORDERS_PATH = "/api/v1/orders"
NOOP_PATH = "/api/v1/bench/noop"
NOTIFY_PATH = "/api/v1/payments/notify"


_errors = Console(stderr=True)


class SetupError(Exception):
    """The sale could not be set up (exit status 2); the message says what and where."""


@dataclass(frozen=True, slots=True)
class Sale:
    """One run: its id, the settings of every process in it, the API's base URL, the product
    on sale and its terms (``stock`` and ``per_user_limit`` in units)."""

    run_id: str
    settings: Settings
    isolated: bool
    url: str
    product_id: int
    stock: int
    per_user_limit: int


def sale_settings(settings: Settings, run_id: str, window_seconds: int | None) -> Settings:
    """``settings`` isolated for the run (:func:`service.sale.isolation.isolated_settings`) with a
    random JWT secret of its own and, when given, a payment window of ``window_seconds``."""
    isolated = isolated_settings(settings, run_id)
    payment = isolated.payment
    if window_seconds is not None:
        payment = payment.model_copy(update={"window_seconds": window_seconds})
    auth = isolated.auth.model_copy(update={"jwt_secret": secrets.token_hex(32)})
    return isolated.model_copy(update={"auth": auth, "payment": payment})


def child_env(settings: Settings) -> dict[str, str]:
    """This process's environment plus the ``FLASHSALE_*`` variables that make a subprocess use
    ``settings``' services, names, secret and payment settings (window, channel secrets,
    currency); the API also mounts the no-op benchmark route."""
    return {**os.environ, **environment(settings.model_copy(update={"bench_routes": True}))}


def _where(url: str) -> str:
    """``url`` without its credentials, for messages."""
    return url.rsplit("@", 1)[-1]


def new_sale(settings: Settings, url: str | None, stock: int, per_user_limit: int, window_seconds: int | None) -> Sale:
    """A new run: isolated settings (payment window ``window_seconds`` seconds when given) and a
    local API URL, or ``settings`` as given with ``url``."""
    run_id = f"sale_{secrets.token_hex(4)}"
    product_id = random.randrange(10**9, 2 * 10**9)
    if url is not None:
        return Sale(run_id, settings, False, url.rstrip("/"), product_id, stock, per_user_limit)
    isolated = sale_settings(settings, run_id, window_seconds)
    return Sale(run_id, isolated, True, f"http://127.0.0.1:{free_port()}", product_id, stock, per_user_limit)


class Processes:
    """The sale's subprocesses (``flashsale serve`` / ``consume``), each in a process group of
    its own, output in ``<log_dir>/<name>.log``. :meth:`stop` fills ``exit_codes``."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self._env = env
        self.log_dir = log_dir
        self._running: dict[str, asyncio.subprocess.Process] = {}
        self.exit_codes: dict[str, int] = {}

    async def start(self, name: str, *args: str) -> None:
        """Start ``flashsale ARGS`` (the console script next to this interpreter)."""
        script = Path(sys.executable).with_name("flashsale")
        if not script.exists():
            raise SetupError(f"console script {script} not found (install the project into this environment)")
        with open(self.log_dir / f"{name}.log", "wb") as log:
            self._running[name] = await asyncio.create_subprocess_exec(
                str(script), *args,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self._env, start_new_session=True,
            )

    def exited(self) -> list[str]:
        """``name (exit N)`` of every process that has already exited."""
        return [f"{name} (exit {p.returncode})" for name, p in self._running.items() if p.returncode is not None]

    async def stop(self) -> None:
        """SIGTERM every process, wait up to ``STOP_TIMEOUT`` seconds, then SIGKILL its group."""
        await asyncio.gather(*(self._stop(name, process) for name, process in self._running.items()))

    async def _stop(self, name: str, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            _errors.print(f"[yellow]warning:[/] {name} ignored SIGTERM for {STOP_TIMEOUT:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the process and anything it left behind
        self.exit_codes[name] = await process.wait()


async def _reachable(service: str, url: str, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, or SetupError naming the service that did not answer."""
    try:
        return await asyncio.wait_for(awaitable, CONNECT_TIMEOUT)
    except Exception as exc:
        raise SetupError(f"{service} at {_where(url)} is unreachable: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class UnpaidOrder:
    """An order pending payment: what a channel's notification for it carries (``quantity`` in
    units, ``amount`` in minor currency units)."""

    order_no: str
    user_id: str
    quantity: int
    amount: int


@dataclass(frozen=True, slots=True)
class Stores:
    """The sale's own connections to MySQL, Redis and RabbitMQ (drain, checks, realignment)."""

    settings: Settings
    engine: AsyncEngine
    store: StockStore
    channel: AbstractChannel

    @classmethod
    async def open(cls, stack: AsyncExitStack, settings: Settings) -> Stores:
        """Connect to all three (closed by ``stack``).

        Raises:
            SetupError: a service did not answer.
        """
        engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
        stack.push_async_callback(engine.dispose)
        store = make_store(settings)
        stack.push_async_callback(store.aclose)
        await _reachable("MySQL", settings.db.url, _select_one(engine))
        await _reachable("Redis", settings.redis.url, store.ping())
        connection = await _reachable("RabbitMQ", settings.amqp.url, aio_pika.connect(settings.amqp.url))
        stack.push_async_callback(connection.close)
        return cls(settings, engine, store, await connection.channel())

    async def queue_depth(self, name: str) -> int:
        """Messages ready in queue ``name`` (not those delivered and unacked)."""
        return await queue_depth(self.channel, name)

    async def _scalar(self, query: str, product_id: int) -> Any:
        """The one value ``query`` selects, with ``:p`` = ``product_id`` and ``:pending`` = the
        ``pending_payment`` status code."""
        async with self.engine.connect() as conn:
            params = {"p": product_id, "pending": OrderStatus.PENDING_PAYMENT}
            return (await conn.execute(text(query), params)).scalar_one()

    async def count_orders(self, product_id: int) -> int:
        return await self._scalar("SELECT COUNT(*) FROM orders WHERE product_id = :p", product_id)

    async def mysql_stock(self, product_id: int) -> int:
        """Units on sale in MySQL."""
        return await self._scalar("SELECT stock FROM inventory WHERE product_id = :p", product_id)

    async def youngest_unpaid_age(self, product_id: int) -> int | None:
        """Whole seconds from the newest ``created_at`` of the product's orders pending payment to
        MySQL's ``NOW()`` (both second precision), or None when none is pending."""
        return await self._scalar(
            "SELECT TIMESTAMPDIFF(SECOND, MAX(created_at), NOW()) FROM orders WHERE product_id = :p AND status = :pending",
            product_id,
        )

    async def unpaid_orders(self, product_id: int) -> list[UnpaidOrder]:
        """The product's orders pending payment, in insertion order."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT order_no, user_id, quantity, amount FROM orders"
                    " WHERE product_id = :p AND status = :pending ORDER BY id"
                ),
                {"p": product_id, "pending": OrderStatus.PENDING_PAYMENT},
            )
            return [UnpaidOrder(*row) for row in rows]

    async def facts(self, product_id: int, dead_letters_before: int) -> StoreFacts:
        """What MySQL, Redis and RabbitMQ hold for the product now."""
        async with self.engine.connect() as conn:
            stock, sold = (
                await conn.execute(text("SELECT stock, sold FROM inventory WHERE product_id = :p"), {"p": product_id})
            ).one()
            rows = await conn.execute(
                text("SELECT order_no, request_id, user_id, quantity, status, reason FROM orders WHERE product_id = :p"),
                {"p": product_id},
            )
            orders = [OrderRow(*row) for row in rows]
            rows = await conn.execute(
                text(
                    "SELECT p.order_no, p.event, p.status FROM payments p"
                    " JOIN orders o ON o.order_no = p.order_no WHERE o.product_id = :p"
                ),
                {"p": product_id},
            )
            payments = [PaymentRow(*row) for row in rows]
        amqp = self.settings.amqp
        return StoreFacts(
            mysql_stock=stock,
            mysql_sold=sold,
            orders=orders,
            payments=payments,
            redis_stock=await self.store.stock(product_id),
            journal_ids=[entry.request_id for entry in await self.store.journal(product_id)],
            quota=await self.store.quota(product_id),
            dead_letters=await self.queue_depth(amqp.dead_letter_queue) - dead_letters_before,
            queue_messages=await self.queue_depth(amqp.queue),
        )


async def _select_one(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def _remove(what: str, remove: Callable[[], Awaitable[None]]) -> None:
    """Run one clean-up step; a failure is a warning (the report stands)."""
    try:
        await remove()
    except Exception as exc:
        _errors.print(f"[yellow]warning:[/] could not remove {what}: {exc!r}")


async def _isolate(stack: AsyncExitStack, sale: Sale) -> None:
    """Create the run's database (schema at head); register removal of everything the run
    creates: database, Redis keys, queues and exchanges.

    Raises:
        SetupError: MySQL did not answer or the migration failed.
    """
    settings = sale.settings
    stack.push_async_callback(_remove, f"database, Redis keys and queues of {sale.run_id}", lambda: tear_down(settings))
    try:
        await upgrade(settings.db.url)
    except Exception as exc:
        raise SetupError(f"could not create database {sale.run_id} at {_where(settings.db.url)}: {exc!r}") from exc


async def wait_ready(client: httpx.AsyncClient, processes: Processes, timeout: float) -> None:
    """Poll ``GET /api/v1/health/ready`` until 200.

    Raises:
        SetupError: not ready within ``timeout`` seconds, or a subprocess exited meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        if dead := processes.exited():
            raise SetupError(f"{', '.join(dead)} exited during start-up")
        try:
            response = await client.get("/api/v1/health/ready")
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        if time.monotonic() > deadline:
            raise SetupError(f"API at {client.base_url} not ready after {timeout:.0f}s: {last}")
        await asyncio.sleep(0.25)


async def create_product(client: httpx.AsyncClient, sale: Sale) -> None:
    """``PUT /api/v1/admin/products/{id}`` (admin JWT): the product, its stock and per-user limit.

    Raises:
        SetupError: the API refused, or Redis stock is not the stock asked for.
    """
    admin = issue_token(sale.settings.auth.jwt_secret, "sale-admin", admin=True)
    body = {"stock": sale.stock, "price": PRICE, "per_user_limit": sale.per_user_limit, "name": f"flash sale {sale.run_id}"}
    try:
        response = await client.put(
            f"/api/v1/admin/products/{sale.product_id}", json=body, headers={"Authorization": f"Bearer {admin}"}
        )
    except httpx.HTTPError as exc:
        raise SetupError(f"creating product {sale.product_id} failed: {exc!r}") from exc
    if response.status_code != 200:
        raise SetupError(f"creating product {sale.product_id} failed: {response.status_code} {response.text[:300]}")
    loaded = msgspec.json.decode(response.content, type=RealignReport)
    if loaded.redis_stock_after != sale.stock:
        raise SetupError(f"product {sale.product_id}: Redis stock {loaded.redis_stock_after}, expected {sale.stock}")


async def noop_skipped(client: httpx.AsyncClient, sale: Sale, noop_requests: int) -> str | None:
    """Why the no-op wave does not run (None: it runs): disabled, or ``POST`` :data:`NOOP_PATH`
    answers 404 to one request with a buyer's JWT (the route is not mounted).

    Raises:
        SetupError: the API did not answer.
    """
    if noop_requests == 0:
        return "disabled (--noop-requests 0)"
    token = issue_token(sale.settings.auth.jwt_secret, "sale-probe")
    body = {"product_id": sale.product_id, "quantity": 1}
    try:
        response = await client.post(NOOP_PATH, json=body, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        raise SetupError(f"probing {NOOP_PATH} failed: {exc!r}") from exc
    if response.status_code == 404:
        return f"{NOOP_PATH} answered 404: not mounted (the API needs FLASHSALE_BENCH_ROUTES=true)"
    return None


def mint_tokens(sale: Sale, *plans: list[Job]) -> dict[str, str]:
    """``Authorization`` header value (``Bearer <JWT>``) per user of ``plans``."""
    auth = sale.settings.auth
    users = {shot.user for jobs in plans for job in jobs for shot in job.shots}
    return {user: f"Bearer {issue_token(auth.jwt_secret, user, ttl_seconds=auth.token_ttl_seconds)}" for user in users}


def notification(sale: Sale, order: UnpaidOrder) -> httpx.Request:
    """A ``paid`` notification for ``order`` as the first configured channel sends it: the
    order's amount in the shop's currency, transaction id ``<run id>-<order_no>``, signed with
    ``X-Signature`` = hex HMAC-SHA256 of the raw body (:func:`service.domain.payments.signed`)."""
    payment = sale.settings.payment
    channel, secret = next(iter(payment.channel_secrets.items()))
    note = Notification(
        channel=channel,
        channel_txn_id=f"{sale.run_id}-{order.order_no}",
        order_no=order.order_no,
        amount=order.amount,
        currency=payment.currency,
        event="paid",
    )
    body, headers = signed(secret, note)
    return httpx.Request("POST", f"{sale.url}{NOTIFY_PATH}", content=body, headers=headers)


async def drain(stores: Stores, sale: Sale, expected_orders: int, processes: Processes, console: Console) -> float | None:
    """Wait until MySQL holds ``expected_orders`` order rows for the product and the order queue
    has no ready message, on :data:`DRAINED_POLLS` polls in a row.

    Returns seconds from the call to the first of those polls, or None when that did not happen
    within :data:`DRAIN_TIMEOUT` or a subprocess exited.
    """
    started = time.perf_counter()
    streak, settled_at = 0, started
    with console.status("draining") as status:
        while time.perf_counter() - started < DRAIN_TIMEOUT and not processes.exited():
            now = time.perf_counter()
            rows = await stores.count_orders(sale.product_id)
            ready = await stores.queue_depth(sale.settings.amqp.queue)
            if rows >= expected_orders and ready == 0:
                settled_at = now if streak == 0 else settled_at
                streak += 1
                if streak == DRAINED_POLLS:
                    return settled_at - started
            else:
                streak = 0
            status.update(f"draining: {rows}/{expected_orders} orders in MySQL, {ready} messages queued")
            await asyncio.sleep(DRAIN_POLL)
    if dead := processes.exited():
        _errors.print(f"[red]error:[/] {', '.join(dead)} exited while draining")
    else:
        _errors.print(f"[red]error:[/] the queue did not drain within {DRAIN_TIMEOUT:.0f}s")
    return None


@dataclass(frozen=True, slots=True)
class Load:
    """The traffic asked for: ``requests`` purchases from ``users`` buyers, ``noop_requests``
    no-op requests before them (0 = none), over ``concurrency`` connections; ``pay_share`` of
    the orders pending payment after the first drain get paid (0 = no lifecycle phases)."""

    requests: int
    users: int
    concurrency: int
    noop_requests: int
    pay_share: float


async def _start(stack: AsyncExitStack, sale: Sale, processes: Processes, workers: int, consumers: int) -> Stores:
    """Isolate (unless ``--url``), connect, start the processes; stopped and removed by ``stack``.

    Returns the sale's connections; raises SetupError when something cannot be set up.
    """
    if sale.isolated:
        await _isolate(stack, sale)
    stores = await Stores.open(stack, sale.settings)
    if sale.isolated:
        await declare_topology(stores.channel, sale.settings.amqp)
    stack.push_async_callback(processes.stop)
    if sale.isolated:
        port = str(httpx.URL(sale.url).port)
        await processes.start("api", "serve", "--host", "127.0.0.1", "--port", port, "--workers", str(workers))
    for number in range(1, consumers + 1):
        await processes.start(f"consumer-{number}", "consume")
    return stores


async def _open_sale(sale: Sale, processes: Processes, console: Console, noop_requests: int) -> str | None:
    """Wait for the API, put the product on sale, probe the no-op route; returns why the no-op
    wave is skipped (None: it runs). Raises SetupError."""
    async with httpx.AsyncClient(base_url=sale.url, timeout=REQUEST_TIMEOUT, trust_env=not sale.isolated) as client:
        with console.status(f"waiting for the API at {sale.url}"):
            await wait_ready(client, processes, READY_TIMEOUT if sale.isolated else CONNECT_TIMEOUT)
        await create_product(client, sale)
        skipped = await noop_skipped(client, sale, noop_requests)
    console.print(f"{sale.run_id}: product {sale.product_id} on sale, {sale.stock} units")
    console.print(f"process logs (kept only if something fails): {processes.log_dir}", soft_wrap=True)
    if skipped:
        console.print(f"no-op ceiling skipped: {skipped}")
    return skipped


async def send_wave(
    sale: Sale, console: Console, label: str, requests: list[httpx.Request], jobs: list[Job], concurrency: int
) -> Wave:
    """Send ``requests`` (``[shot.index]`` for the shots of ``jobs``) from ``concurrency``
    connections set up as for the purchase load, with progress ``label``: every wave (no-op,
    purchase, payments, resale) goes through here."""
    generator = LoadGenerator(requests)
    async with AsyncExitStack() as stack:
        clients = load_clients(stack, concurrency, trust_env=not sale.isolated)
        with progress_bar(console) as progress:
            seconds = await generator.run(jobs, clients, concurrency, progress, label)
    return Wave(jobs, generator.outcomes, seconds)


def _accepted_orders(wave: Wave) -> int:
    """Distinct order numbers answered with 202 in ``wave``."""
    return len({o.order_no for o in wave.outcomes if o.code == ACCEPTED})


async def _first_waves(
    sale: Sale, console: Console, load: Load, noop_requests: int
) -> tuple[Wave | None, Wave, float]:
    """Plan, mint the JWTs (timed apart), send ``noop_requests`` no-op requests (0: no no-op
    wave), then the purchase wave, both with the same JWTs, bodies, mix and concurrency; returns
    the no-op wave (None when not sent), the purchase wave, and the seconds spent minting."""
    purchase_jobs = build_plan(load.requests, load.users, sale.per_user_limit, random.Random(sale.run_id))
    noop_jobs = build_plan(noop_requests, load.users, sale.per_user_limit, random.Random(f"{sale.run_id}:noop"))
    with console.status("minting JWTs"):
        started = time.perf_counter()
        tokens = mint_tokens(sale, purchase_jobs, noop_jobs)
        token_seconds = time.perf_counter() - started
    ceiling = None
    if noop_jobs:
        requests = build_requests(f"{sale.url}{NOOP_PATH}", noop_jobs, sale.product_id, tokens)
        ceiling = await send_wave(sale, console, "no-op", requests, noop_jobs, load.concurrency)
    requests = build_requests(f"{sale.url}{ORDERS_PATH}", purchase_jobs, sale.product_id, tokens)
    purchase = await send_wave(sale, console, "purchase", requests, purchase_jobs, load.concurrency)
    return ceiling, purchase, token_seconds


async def _pay(stores: Stores, sale: Sale, console: Console, load: Load) -> tuple[Wave, list[str], int]:
    """Send a ``paid`` notification (:func:`notification`) for a ``load.pay_share`` share of the
    orders pending payment, chosen at random, at most :data:`PAY_CONCURRENCY` at once; returns
    the wave, the order numbers notified (``[shot.index]``) and how many orders were left unpaid."""
    unpaid = await stores.unpaid_orders(sale.product_id)
    chosen = random.Random(f"{sale.run_id}:pay").sample(unpaid, round(load.pay_share * len(unpaid)))
    jobs = [Job(Kind.PAY, (Shot(index, order.user_id, order.quantity, None),)) for index, order in enumerate(chosen)]
    requests = [notification(sale, order) for order in chosen]
    wave = await send_wave(sale, console, "payments", requests, jobs, min(load.concurrency, PAY_CONCURRENCY))
    return wave, [order.order_no for order in chosen], len(unpaid) - len(chosen)


async def _let_window_lapse(stores: Stores, sale: Sale, console: Console) -> float:
    """Wait until every order of the product still pending payment is older than the payment
    window in MySQL's clock (``created_at`` and ``NOW()`` have whole seconds, so the sweep's
    ``created_at < NOW() - window`` holds from an age of window + 1 s); returns seconds waited."""
    window = sale.settings.payment.window_seconds
    started = time.perf_counter()
    with console.status(f"letting the {window}s payment window lapse"):
        while (age := await stores.youngest_unpaid_age(sale.product_id)) is not None and age <= window:
            await asyncio.sleep(window + 1 - age + WINDOW_MARGIN)
    return time.perf_counter() - started


async def _sweep(stores: Stores, product_id: int) -> int:
    """One payment-timeout sweep of the sale's product in this process:
    :func:`service.domain.lifecycle.expire_unpaid` (what ``flashsale sweep`` runs) with the run's key
    prefix and window; returns orders cancelled."""
    window = stores.settings.payment.window_seconds
    return await expire_unpaid(stores.engine, stores.store, window, product_id=product_id)


async def _resale(sale: Sale, console: Console, concurrency: int, on_sale: int) -> Wave:
    """New buyers (``resale-<n>``, one per job, never seen before) send :data:`RESALE_FACTOR`
    requests per unit on sale (at least :data:`RESALE_MIN_REQUESTS`), mixed as the purchase load."""
    requests_ = max(RESALE_FACTOR * on_sale, RESALE_MIN_REQUESTS)
    jobs = build_plan(requests_, requests_, sale.per_user_limit, random.Random(f"{sale.run_id}:resale"), "resale")
    requests = build_requests(f"{sale.url}{ORDERS_PATH}", jobs, sale.product_id, mint_tokens(sale, jobs))
    return await send_wave(sale, console, "resale", requests, jobs, concurrency)


async def _lifecycle(
    stores: Stores, sale: Sale, processes: Processes, console: Console, load: Load, orders_so_far: int
) -> LifecycleRun:
    """After the first drain (``orders_so_far`` order rows): pay a share, let the rest lapse,
    sweep once, resell the returned units to new buyers, drain again."""
    payments, notified, unpaid = await _pay(stores, sale, console, load)
    wait_seconds = await _let_window_lapse(stores, sale, console)
    stock_before = await stores.mysql_stock(sale.product_id)
    swept = await _sweep(stores, sale.product_id)
    on_sale = await stores.mysql_stock(sale.product_id)
    console.print(f"paid {len(notified)} orders; swept {swept} unpaid ones; {on_sale} units on sale again")
    resale = await _resale(sale, console, load.concurrency, on_sale)
    drain_seconds = await drain(stores, sale, orders_so_far + _accepted_orders(resale), processes, console)
    return LifecycleRun(
        pay_share=load.pay_share,
        window_seconds=sale.settings.payment.window_seconds,
        payments=payments,
        notified=notified,
        unpaid=unpaid,
        wait_seconds=wait_seconds,
        swept=swept,
        returned=on_sale - stock_before,
        on_sale=on_sale,
        resale=resale,
        drain_seconds=drain_seconds,
    )


async def _measure(sale: Sale, processes: Processes, console: Console, load: Load, workers: int, consumers: int) -> Measured:
    """Every phase from set-up to the stores' final state; stops and cleans up on the way out."""
    async with AsyncExitStack() as stack:
        stores = await _start(stack, sale, processes, workers, consumers)
        try:
            dead_letters_before = await stores.queue_depth(sale.settings.amqp.dead_letter_queue)
        except aio_pika.exceptions.AMQPError as exc:
            raise SetupError(f"dead-letter queue {sale.settings.amqp.dead_letter_queue!r} not found: {exc!r}") from exc
        noop_skip = await _open_sale(sale, processes, console, load.noop_requests)
        noop_requests = 0 if noop_skip else load.noop_requests
        noop, purchase, token_seconds = await _first_waves(sale, console, load, noop_requests)
        orders = _accepted_orders(purchase)
        drain_seconds = await drain(stores, sale, orders, processes, console)
        lifecycle = None
        if load.pay_share and drain_seconds is not None:
            lifecycle = await _lifecycle(stores, sale, processes, console, load, orders)
        async with open_realigner(sale.settings) as realigner:
            realignment = await realigner.realign(sale.product_id)
        facts = await stores.facts(sale.product_id, dead_letters_before)
    return Measured(purchase, noop, noop_skip, lifecycle, token_seconds, drain_seconds, realignment, facts)


def _quiet_logs() -> None:
    """This process logs warnings and up to (on stderr): stdout is the report's."""
    configure_logging("WARNING")


def _failed(sale: Sale, processes: Processes, message: str, status: int, as_json: bool) -> int:
    """Say why the sale ended without a report (stderr; with ``as_json`` also one JSON document
    ``{"ok": false, "run_id", "error", "logs"}`` on stdout) and return ``status``."""
    _errors.print(f"[bold red]{message}[/]\nprocess logs: {processes.log_dir}")
    if as_json:
        failure = {"ok": False, "run_id": sale.run_id, "error": message, "logs": str(processes.log_dir)}
        print(msgspec.json.encode(failure).decode())
    return status


async def run_sale(
    settings: Settings,
    *,
    stock: int,
    requests_: int,
    users: int,
    concurrency: int,
    per_user_limit: int,
    workers: int,
    consumers: int,
    url: str | None,
    as_json: bool,
    noop_requests: int,
    pay_share: float,
    payment_window: int,
) -> int:
    """``flashsale sale`` (see the module docstring); returns the exit status: 0 every invariant
    holds, 1 one failed, 2 set-up failed, 130 interrupted. Prints the report to stdout (rich tables, or exactly one
    JSON document with ``as_json``); progress and errors go to stderr. ``pay_share`` > 0 needs
    ``url`` None (the sweep cancels every unpaid order of the database past the window);
    ``payment_window`` in seconds applies only then."""
    began = time.perf_counter()
    _quiet_logs()
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # clean up as on Ctrl-C
    console = Console(stderr=True, quiet=as_json)
    window = payment_window if pay_share else None
    sale = new_sale(settings, url, stock, per_user_limit, window)
    processes = Processes(child_env(sale.settings), Path(tempfile.mkdtemp(prefix=f"flashsale-{sale.run_id}-")))
    try:
        load = Load(requests_, users, concurrency, noop_requests, pay_share)
        measured = await _measure(sale, processes, console, load, workers, consumers)
    except SetupError as exc:
        return _failed(sale, processes, f"set-up failed: {exc}", 2, as_json)
    except asyncio.CancelledError:
        cleaned = ", run data removed" if sale.isolated else ""
        return _failed(sale, processes, f"interrupted; processes stopped{cleaned}", 130, as_json)

    run = {
        "run_id": sale.run_id,
        "isolated": sale.isolated,
        "url": sale.url,
        "product_id": sale.product_id,
        "stock": stock,
        "per_user_limit": per_user_limit,
        "price": PRICE,
        "requests": requests_,
        "users": users,
        "concurrency": concurrency,
        "workers": workers if sale.isolated else None,
        "consumers": consumers,
        "noop_requests": noop_requests,
        "pay_share": pay_share,
        "payment_window_seconds": window,
    }
    report = build_report(run, measured, time.perf_counter() - began, processes.exit_codes)
    if report["ok"] and not any(processes.exit_codes.values()):
        shutil.rmtree(processes.log_dir, ignore_errors=True)
    else:
        report["logs"] = str(processes.log_dir)
    if as_json:
        print(msgspec.json.encode(report).decode())
    else:
        render(report, Console(width=None if sys.stdout.isatty() else 120))
    return 0 if report["ok"] else 1
