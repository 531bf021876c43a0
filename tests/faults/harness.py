"""One fault case of the suite: a small flash sale on the private servers, run by the project's
own processes, a fault injected mid-sale, then the invariants and the row of the table.

A case (:class:`FaultSale`) gets settings of its own on the session's private Redis, MariaDB
and RabbitMQ (database, key prefix and queue names ``fault_<hex>``, removed afterwards) and
starts, as compose would, ``flashsale serve --workers 2``, ``flashsale consume``, ``flashsale
realign --watch 1`` and ``flashsale sweep --watch 5`` under a small supervisor that restarts a
process that ended (compose's ``restart: unless-stopped``) and records the exits it did not
cause. Buyers (the plan of ``flashsale sale``: :func:`service.sale.plan.build_plan`, every
request with an Idempotency-Key) send their purchases from :data:`CONCURRENCY` connections and
retry a 503, a 429, a 409 ``request_in_progress`` or a lost connection with the same key until
they get an answer that is final (:data:`BUYER_PATIENCE`). Meanwhile a canary buyer purchases a
second product twice a second and the suite times how long each order takes to get its row;
the readiness of the API and the reservation journal are sampled.

After the load and the fault, :meth:`FaultSale.finish` waits for the sale to settle and checks,
for the row of the table (:class:`Row`):

- lost: a 202 whose order has no row in MySQL, or whose ``GET /orders/{order_no}`` (as the
  buyer) does not answer 200 with the order written;
- duplicate: two rows for one request, one order number answered to two requests (or two
  numbers to one), a row that is not the order its 202 described;
- no 202: a row whose buyer was never told (every buyer retries until a final answer);
- oversold: units held in MySQL beyond the stock (or ``sold`` beyond it);
- over-limit: buyers holding more units than the per-user limit in MySQL;
- stranded: reservations left in the journal without a row for longer than
  :data:`STRANDED_BOUND` seconds (counted from the end of the fault);
- recovered by itself: within :data:`RECOVERY_TIMEOUT` after the load, with no step by a
  person (the supervisor only restarts what ended, as compose does): every 202 has its row,
  Redis stock = MySQL stock with an empty journal and quotas = units held, nothing left in the
  order queue, no message of the sale in the dead-letter queue, the API ready and buying again,
  every process still running (none ended by itself), plus the checks of the fault's own
  (:attr:`FaultSale.extra_checks`);
- time to recover: from the end of the fault to the first canary order, bought after it, that
  has its row (and the API ready);
- 503 share and longest 503 window, and the bound on the window (tests/faults/availability.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import msgspec
from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from db.migrate import upgrade
from db.models import OrderStatus
from db.queries import orders as order_queries
from service.adapters.broker_topology import declare_topology
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.stores import RedisStores, make_stores
from service.api.tokens import issue_token
from service.bootstrap import open_job, opened
from service.domain.model.order_message import encode_order, orders_of
from service.domain.stock.catalog import ProductInput
from service.runtime import stop_task
from service.sale.isolation import environment, free_port, new_run_id, sale_settings
from service.sale.plan import ACCEPTED, Answer, Job, Kind, Shot, build_plan
from service.sale.report import summarize
from service.sale.stores import tear_down
from service.settings import Settings
from tests.faults import availability
from tests.servers import PrivateMariaDB, PrivateRabbitMQ, PrivateRedis
from tests.support import message_for

# -- the sale ------------------------------------------------------------------------------------
STOCK = 500
LIMIT = 2
REQUESTS = 2400
USERS = 1200
CONCURRENCY = 64
PURCHASE_RATE = 200.0
"""New purchases per second at most (retries are not paced): the 2,400 take about 12 s and the
stock sells out over the first few, so a fault injected mid-sale meets orders in flight."""
WORKERS = 2
PREFETCH = 64  # the consumer's prefetch window (the poison flood is larger)
PRICE = 1500

# -- the deployment ------------------------------------------------------------------------------
GRACE_SECONDS = 3.0  # FLASHSALE_REALIGN__GRACE_SECONDS: a reservation without a row is overdue after this
WATCH_SECONDS = 1.0  # realign --watch
SWEEP_SECONDS = 5.0  # sweep --watch (the payment window is 15 minutes: it cancels nothing here)

# -- what the suite demands ----------------------------------------------------------------------
STRANDED_BOUND = 15.0
"""Seconds a reservation may stay in the journal without a row once the fault is over (the
bound for stranded reservations in docs/ARCHITECTURE.md, "Self-healing", with this deployment's
grace and watch interval)."""
RECOVERY_TIMEOUT = 120.0  # seconds after the load (and the fault) for everything to settle
BUYER_PATIENCE = 90.0  # seconds a buyer keeps retrying one purchase
LOAD_DEADLINE = 150.0
"""Seconds the load may take in all: past it, retries stop and purchases not sent yet are not
sent (a service that never recovers would otherwise keep the 64 connections retrying for hours)."""
POISON_STALL_BOUND = 5.0  # seconds a poison flood may hold up real orders ("a few seconds")
REPUBLISH_PER_ORDER = 3
"""Re-published messages per accepted order at most while consumers lag (once per back-off
period, not once per realignment pass: a pass per second for ~20 s was 6 per order)."""
READINESS_LIE_BOUND = 3.0
"""Seconds readiness may say 200 while every purchase answers 503 (Redis lost its data)."""

RETRY_STATUSES = {0, 429, 503}  # no answer (connection lost, timeout), too many requests, unavailable
RETRY_CODES = {"request_in_progress"}  # 409: the same key's purchase is still being settled
CANARY_STOCK = 1_000_000
CANARY_EVERY = 0.5


_HELD_BY_USER = text(
    "SELECT user_id, SUM(quantity) FROM orders WHERE product_id = :p AND status NOT IN :released GROUP BY user_id"
).bindparams(bindparam("released", expanding=True))


def monotonic() -> float:
    return time.monotonic()


@dataclass
class Servers:
    """The session's private servers (one of each, shared by the cases one after another)."""

    redis: PrivateRedis
    mariadb: PrivateMariaDB
    rabbitmq: PrivateRabbitMQ

    async def ensure_running(self) -> None:
        """Start whatever an earlier case left down, resume a paused broker."""
        for server in (self.redis, self.mariadb, self.rabbitmq):
            if server.process is not None:
                server.resume()
            if not server.running:
                await server.start()


# -- processes -----------------------------------------------------------------------------------


@dataclass
class _Process:
    name: str
    argv: list[str]
    process: asyncio.subprocess.Process | None = None
    expected_exit: bool = False  # the suite killed it (or is stopping it)
    stopped: bool = False  # the case is over: not started again
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's, this process only


class Supervisor:
    """The case's ``flashsale`` processes, each in a process group of its own with its output
    in ``<log_dir>/<name>.log``. A process that ends is started again after a second, as
    compose's ``restart: unless-stopped`` would; an end the suite did not cause is recorded in
    :attr:`exits` (a crash, a crash loop, an exit on an outage: not "by itself")."""

    RESTART_DELAY = 1.0

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self._env = env
        self.log_dir = log_dir
        self._processes: dict[str, _Process] = {}
        self.exits: list[str] = []
        self._watcher: asyncio.Task[None] | None = None
        self._respawns: set[asyncio.Task[None]] = set()
        self._script = str(Path(sys.executable).with_name("flashsale"))

    async def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> None:
        """Start ``name`` (``flashsale *argv``), with ``env`` on top of the case's environment."""
        entry = self._processes.setdefault(name, _Process(name, list(argv), env=dict(env or {})))
        await self._spawn(entry)
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())

    async def _spawn(self, entry: _Process) -> None:
        log = (self.log_dir / f"{entry.name}.log").open("ab")
        with log:
            entry.process = await asyncio.create_subprocess_exec(
                self._script,
                *entry.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self._env, **entry.env},
                start_new_session=True,
            )
        entry.expected_exit = False
        entry.starts += 1

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            for entry in list(self._processes.values()):
                process = entry.process
                if process is None or process.returncode is None:
                    continue
                if not entry.expected_exit:
                    self.exits.append(f"{entry.name} exited {process.returncode}")
                entry.process = None
                self._respawns.add(asyncio.create_task(self._respawn(entry)))

    async def _respawn(self, entry: _Process) -> None:
        await asyncio.sleep(self.RESTART_DELAY)
        if entry.process is None and not entry.stopped:
            await self._spawn(entry)

    def pid(self, name: str) -> int | None:
        entry = self._processes.get(name)
        return None if entry is None or entry.process is None else entry.process.pid

    def running(self, name: str) -> bool:
        entry = self._processes.get(name)
        return entry is not None and entry.process is not None and entry.process.returncode is None

    def children(self, name: str) -> list[int]:
        """The child processes of ``name`` (granian's workers of ``api``)."""
        pid = self.pid(name)
        if pid is None:
            return []
        found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
        return sorted(int(p) for p in found.stdout.split())

    async def kill(self, name: str) -> None:
        """SIGKILL ``name``'s whole process group (the supervisor starts it again)."""
        entry = self._processes[name]
        if entry.process is None:
            return
        entry.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(entry.process.pid, signal.SIGKILL)
        await entry.process.wait()

    async def started_again(self, name: str, timeout: float = 30.0) -> None:
        deadline = monotonic() + timeout
        while not self.running(name):
            if monotonic() > deadline:
                raise AssertionError(f"{name} was not started again")
            await asyncio.sleep(0.05)

    async def stop_all(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for entry in self._processes.values():
            entry.stopped = True
        await asyncio.gather(*self._respawns, return_exceptions=True)
        await asyncio.gather(*(self._stop(entry) for entry in self._processes.values()))

    async def _stop(self, entry: _Process) -> None:
        entry.stopped = True
        process = entry.process
        if process is None:
            return
        entry.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            pass  # granian's graceful stop can hang after a respawn
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()

    def log_text(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        return ""


# -- buyers --------------------------------------------------------------------------------------


@dataclass
class Sent:
    """One answer a buyer got (every try, final or not): when, status, code, over which
    connection (:func:`availability.connection_of`)."""

    at: float
    status: int
    code: str
    connection: int = 0


class _Body(msgspec.Struct):
    """The fields read from a 202 or a problem body (``status`` differs in type between them)."""

    code: str | None = None
    order_no: str | None = None
    request_id: str | None = None


class Buyers:
    """Sends the plan's purchases; each one retried with its Idempotency-Key until final."""

    def __init__(self, url: str, product_id: int, settings: Settings) -> None:
        self._url = url
        self._product_id = product_id
        self._secret = settings.auth.jwt_secret
        self._tokens: dict[str, str] = {}
        self.jobs: list[Job] = []
        self.outcomes: list[Answer | None] = []
        self.tries: list[Sent] = []
        self.done = 0
        self.sent = 0  # tries
        self.started = 0  # purchases sent at least once
        self.deadline = float("inf")
        self.accepted_units = 0
        self._paced_from = 0.0
        self._slots = 0

    def token(self, user: str) -> str:
        if user not in self._tokens:
            self._tokens[user] = f"Bearer {issue_token(self._secret, user, ttl_seconds=3600)}"
        return self._tokens[user]

    def plan(self, seed: str) -> list[Job]:
        """The sale's plan, every purchase with an Idempotency-Key (a buyer who retries a 503
        without one could buy twice: that is the buyer's doing, not a fault of the service)."""
        jobs = build_plan(REQUESTS, USERS, LIMIT, random.Random(seed))
        keyed = []
        for job in jobs:
            shots = tuple(
                shot if shot.key else Shot(shot.index, shot.user, shot.quantity, f"nk{shot.index}")
                for shot in job.shots
            )
            keyed.append(Job(job.kind, shots))
        return keyed

    def add(self, jobs: list[Job]) -> list[Job]:
        """Take ``jobs`` (indices from 0) into the record, renumbered after what is there."""
        offset = len(self.outcomes)
        moved = [
            Job(job.kind, tuple(Shot(s.index + offset, s.user, s.quantity, s.key) for s in job.shots)) for job in jobs
        ]
        self.jobs.extend(moved)
        self.outcomes.extend([None] * sum(len(job.shots) for job in jobs))
        return moved

    async def run(self, jobs: list[Job], concurrency: int = CONCURRENCY) -> None:
        """Send ``jobs`` from ``concurrency`` connections, within :data:`LOAD_DEADLINE` seconds."""
        self.deadline = monotonic() + LOAD_DEADLINE
        self._paced_from, self._slots = monotonic(), 0
        pending = iter(self.add(jobs))
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=self._url, limits=limits, timeout=30, trust_env=False) as client:

            async def worker() -> None:
                for job in pending:
                    if monotonic() > self.deadline:
                        for shot in job.shots:
                            self.outcomes[shot.index] = Answer(0, "not_sent", None, None, 0.0, monotonic())
                        continue
                    await self._pace(len(job.shots))
                    if job.kind is Kind.DUPLICATE:
                        await asyncio.gather(*(self._buy(client, shot) for shot in job.shots))
                    else:
                        for shot in job.shots:
                            await self._buy(client, shot)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def _pace(self, purchases: int) -> None:
        """Wait for this job's turn at :data:`PURCHASE_RATE` purchases a second."""
        turn = self._paced_from + self._slots / PURCHASE_RATE
        self._slots += purchases
        if (wait := turn - monotonic()) > 0:
            await asyncio.sleep(wait)

    async def _buy(self, client: httpx.AsyncClient, shot: Shot) -> None:
        body = msgspec.json.encode({"product_id": self._product_id, "quantity": shot.quantity})
        headers = {"Authorization": self.token(shot.user), "Content-Type": "application/json"}
        if shot.key:
            headers["Idempotency-Key"] = shot.key
        began = monotonic()
        self.started += 1
        while True:
            started = monotonic()
            self.sent += 1
            connection = 0
            try:
                response = await client.post("/api/v1/orders", content=body, headers=headers)
            except httpx.HTTPError as exc:
                code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error"
                answer = Answer(0, code, None, None, monotonic() - started, monotonic())
                retry_after = 0.5
            else:
                try:
                    parsed = msgspec.json.decode(response.content, type=_Body)
                except msgspec.DecodeError:
                    parsed = _Body()
                status = response.status_code
                connection = availability.connection_of(response)
                code = ACCEPTED if status == 202 else parsed.code or f"http_{status}"
                answer = Answer(status, code, parsed.order_no, parsed.request_id, monotonic() - started, monotonic())
                retry_after = min(float(response.headers.get("retry-after", "0.5") or 0.5), 1.0)
            self.tries.append(Sent(monotonic(), answer.status, answer.code, connection))
            final = answer.status not in RETRY_STATUSES and answer.code not in RETRY_CODES
            if final or monotonic() - began > BUYER_PATIENCE or monotonic() > self.deadline:
                self.outcomes[shot.index] = answer
                if answer.code == ACCEPTED:
                    self.accepted_units += shot.quantity
                self.done += 1
                return
            await asyncio.sleep(retry_after * random.uniform(0.5, 1.0))


# -- the case ------------------------------------------------------------------------------------


@dataclass
class Row:
    """One row of the table (see the module docstring); ``details`` go to the JSON report."""

    fault: str
    accepted: int = 0
    rows: int = 0
    lost: int = 0
    duplicate: int = 0
    no_202: int = 0
    oversold: int = 0
    over_limit: int = 0
    stranded: int = 0
    recovered: bool = False
    time_to_recover: float | None = None
    share_503: float = 0.0
    longest_503: float = 0.0  # seconds, one worker
    failed_checks: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicate == 0
            and self.no_202 == 0
            and self.oversold == 0
            and self.over_limit == 0
            and self.stranded == 0
            and self.recovered
        )


class FaultSale:
    """One case: see the module docstring. Use as ``async with FaultSale(...) as sale``."""

    def __init__(self, servers: Servers, fault: str, log_root: Path) -> None:
        self.servers = servers
        self.fault = fault
        self.run_id = new_run_id("fault")
        base = Settings().model_copy(
            update={
                "redis": Settings().redis.model_copy(update={"url": servers.redis.url}),
                "db": Settings().db.model_copy(update={"url": servers.mariadb.url("flashsale")}),
                "amqp": Settings().amqp.model_copy(update={"url": servers.rabbitmq.url}),
            }
        )
        settings = sale_settings(base, self.run_id, None)
        self.settings = settings.model_copy(
            update={
                "realign": settings.realign.model_copy(update={"grace_seconds": GRACE_SECONDS}),
                "log_level": "INFO",
                "metrics": settings.metrics.model_copy(update={"port": 0}),
            }
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.realign_metrics_port = free_port()
        slug = "".join(c if c.isalnum() else "-" for c in fault.lower()).strip("-")
        self.log_dir = log_root / f"{slug[:60]}-{self.run_id}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor({**os.environ, **environment(self.settings)}, self.log_dir)
        self.product_id = random.randrange(10**9, 2 * 10**9)
        self.canary_id = self.product_id + 1
        self.buyers = Buyers(self.url, self.product_id, self.settings)
        self.engine: AsyncEngine | None = None
        self.store: RedisStores | None = None
        self.extra_checks: list[Callable[[], Awaitable[str | None]]] = []
        self.notes: list[str] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self.readiness: list[tuple[float, int]] = []
        self.canary: list[dict[str, Any]] = []  # {"sent", "accepted", "order_no", "row"}
        self.stranded: set[str] = set()
        self.fault_end: float | None = None
        self.fault_start: float | None = None
        self.recovery: float | None = None
        """The fault's own recovery, seconds from its start (availability.py); None: the whole fault."""
        self.load_task: asyncio.Task[None] | None = None
        self.load_end: float | None = None

    # -- set-up and tear-down ---------------------------------------------------------------------

    async def __aenter__(self) -> FaultSale:
        await self.servers.ensure_running()
        await upgrade(self.settings.db.url)
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            await declare_topology(await connection.channel(), self.settings.amqp)
        finally:
            await connection.close()
        self.engine = make_engine(self.settings.db.url, pool_size=4, max_overflow=4)
        self.store = make_stores(self.settings)
        async with opened(open_job(self.settings, publish=False)) as resources:
            for product_id, stock, limit in ((self.product_id, STOCK, LIMIT), (self.canary_id, CANARY_STOCK, 10**6)):
                terms = {"stock": stock, "per_user_limit": limit, "price": PRICE, "stock_mode": "redis"}
                await resources.catalog.set(product_id, msgspec.convert(terms, ProductInput))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        if self.load_task is not None and not self.load_task.done():
            self.load_task.cancel()
        # stop_task cancels again until each ends: Python 3.11 can drop a cancellation inside
        # redis-py (service.runtime.stop_task), and a sampler that lost its one ran for ever
        await asyncio.gather(*(stop_task(task) for task in self._tasks), return_exceptions=True)
        await self.supervisor.stop_all()
        await self.servers.ensure_running()
        if self.store is not None:
            await self.store.aclose()
        if self.engine is not None:
            await self.engine.dispose()
        await tear_down(self.settings)

    # -- processes --------------------------------------------------------------------------------

    async def start_api(self, env: dict[str, str] | None = None) -> None:
        await self.supervisor.start(
            "api", "serve", "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(WORKERS), env=env
        )

    async def start_consumer(self, prefetch: int = PREFETCH) -> None:
        await self.supervisor.start("consumer", "consume", "--prefetch", str(prefetch))

    async def start_realign(self) -> None:
        await self.supervisor.start(
            "realign",
            "realign",
            "--watch",
            str(WATCH_SECONDS),
            "--json",
            "--metrics-port",
            str(self.realign_metrics_port),
        )

    async def start_sweep(self) -> None:
        await self.supervisor.start("sweep", "sweep", "--watch", str(SWEEP_SECONDS), "--json")

    async def start_all(
        self, *, realign: bool = True, consumer: bool = True, api_env: dict[str, str] | None = None
    ) -> None:
        await self.start_api(api_env)
        if consumer:
            await self.start_consumer()
        if realign:
            await self.start_realign()
        await self.start_sweep()
        self._tasks.append(asyncio.create_task(self._sample_readiness()))
        self._tasks.append(asyncio.create_task(self._run_canary()))
        self._tasks.append(asyncio.create_task(self._sample_journal()))

    async def ready(self, timeout: float = 90.0) -> bool:
        """Until ``/health/ready`` answers 200 (False after ``timeout`` seconds)."""
        deadline = monotonic() + timeout
        async with httpx.AsyncClient(base_url=self.url, timeout=5, trust_env=False) as http:
            while monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/api/v1/health/ready")).status_code == 200:
                        return True
                await asyncio.sleep(0.2)
        return False

    # -- the load ---------------------------------------------------------------------------------

    def start_load(self) -> None:
        async def load() -> None:
            await self.buyers.run(self.buyers.plan(self.run_id))
            self.load_end = monotonic()

        self.load_task = asyncio.create_task(load())

    async def mid_sale(self, fraction: float = 0.3) -> None:
        """Until buyers were told 202 for ``fraction`` of the stock (orders are in flight)."""
        while self.buyers.accepted_units < fraction * STOCK:
            if self.load_task is not None and self.load_task.done():
                return
            await asyncio.sleep(0.02)

    def faulted(self) -> None:
        self.fault_start = monotonic()

    def fault_over(self) -> None:
        self.fault_end = monotonic()

    # -- samplers ---------------------------------------------------------------------------------

    async def _sample_readiness(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=3, trust_env=False) as http:
            while True:
                try:
                    status = (await http.get("/api/v1/health/ready")).status_code
                except httpx.HTTPError:
                    status = 0
                self.readiness.append((monotonic(), status))
                await asyncio.sleep(0.25)

    async def _run_canary(self) -> None:
        """A purchase of the canary product every :data:`CANARY_EVERY` seconds (a new buyer
        each, retried like every buyer); each 202 is then watched for its row."""
        number = 0
        limits = httpx.Limits(max_connections=8)
        async with httpx.AsyncClient(base_url=self.url, timeout=10, limits=limits, trust_env=False) as http:
            watcher = asyncio.create_task(self._canary_rows())
            buying: set[asyncio.Task[None]] = set()
            try:
                while True:
                    number += 1
                    task = asyncio.create_task(self._canary_buy(http, f"canary-{number}"))
                    buying.add(task)
                    task.add_done_callback(buying.discard)
                    await asyncio.sleep(CANARY_EVERY)
            finally:
                watcher.cancel()
                for task in buying:
                    task.cancel()

    async def _canary_buy(self, http: httpx.AsyncClient, user: str) -> None:
        entry: dict[str, Any] = {"sent": monotonic(), "accepted": None, "order_no": None, "row": None}
        headers = {"Authorization": self.buyers.token(user), "Idempotency-Key": f"{user}-key"}
        body = {"product_id": self.canary_id, "quantity": 1}
        while monotonic() - entry["sent"] < BUYER_PATIENCE:
            try:
                response = await http.post("/api/v1/orders", json=body, headers=headers)
            except httpx.HTTPError:
                await asyncio.sleep(0.5)
                continue
            if response.status_code == 202:
                entry["accepted"], entry["order_no"] = monotonic(), response.json()["order_no"]
                self.canary.append(entry)
                return
            if response.status_code not in (409, 429, 503):
                return
            await asyncio.sleep(0.5)

    async def _canary_rows(self) -> None:
        assert self.engine is not None
        while True:
            await asyncio.sleep(0.2)
            waiting = {entry["order_no"]: entry for entry in self.canary if entry["row"] is None}
            if not waiting:
                continue
            try:
                async with self.engine.connect() as conn:
                    rows = await conn.execute(order_queries.PRESENT_ORDER_NOS, {"order_nos": list(waiting)})
                    found = {order_no for (order_no,) in rows}
            except Exception:
                continue
            now = monotonic()
            for order_no in found:
                waiting[order_no]["row"] = now

    async def _present(self, request_ids: list[str]) -> set[str]:
        assert self.engine is not None
        present: set[str] = set()
        async with self.engine.connect() as conn:
            for start in range(0, len(request_ids), 1000):
                chunk = request_ids[start : start + 1000]
                rows = await conn.execute(order_queries.PRESENT_REQUEST_IDS, {"r": chunk})
                present.update(request_id for (request_id,) in rows)
        return present

    async def _sample_journal(self) -> None:
        """Every second: the sale's reservations without a row for longer than
        :data:`STRANDED_BOUND` seconds, counted from the end of the fault (while a store is down
        nothing can be expected of realignment)."""
        assert self.store is not None
        while True:
            await asyncio.sleep(1.0)
            try:
                journal = await self.store.stock.journal(self.product_id)
                now_ms = await self.store.stock.server_time_ms()
                present = await self._present([entry.request_id for entry in journal])
            except Exception:
                continue
            if self.fault_start is not None and self.fault_end is None:
                continue  # the fault is on
            since_ms = now_ms - (monotonic() - self.fault_end) * 1000 if self.fault_end is not None else 0
            for entry in journal:
                if entry.request_id in present:
                    continue
                if now_ms - max(entry.reserved_at_ms, since_ms) > STRANDED_BOUND * 1000:
                    self.stranded.add(entry.request_id)

    # -- the stores, directly ---------------------------------------------------------------------

    async def publish_poison(self, count: int = 100) -> None:
        """``count`` well-formed order messages for a product that does not exist."""
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(self.settings.amqp.exchange)
            unknown = self.product_id + 7  # no such product: well-formed messages the consumer cannot apply
            for number in range(count):
                message = message_for(unknown, f"poison-{number}", number + 1)
                await exchange.publish(
                    aio_pika.Message(
                        encode_order(message),
                        message_id=message.request_id,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=self.settings.amqp.queue,
                )
        finally:
            await connection.close()

    async def delete_quotas(self, users: list[str]) -> None:
        assert self.store is not None
        await self.servers.redis.command(
            "HDEL", ProductKeys(self.settings.redis.key_prefix, self.product_id).quota, *users
        )

    def accepted_order_nos(self) -> set[str]:
        return {o.order_no for o in self.buyers.outcomes if o is not None and o.code == ACCEPTED and o.order_no}

    def holders_of_the_limit(self, count: int) -> list[str]:
        """Up to ``count`` buyers who were answered 202 for the whole limit already."""
        units: Counter[str] = Counter()
        for job in self.buyers.jobs:
            for shot in job.shots:
                outcome = self.buyers.outcomes[shot.index]
                if outcome is not None and outcome.code == ACCEPTED:
                    units[shot.user] += shot.quantity
        return [user for user, held in units.items() if held >= LIMIT][:count]

    async def republished(self) -> float | None:
        """``flashsale_realign_republished_total`` of the sale's product, from realign's /metrics."""
        try:
            async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
                body = (await http.get(f"http://127.0.0.1:{self.realign_metrics_port}/metrics")).text
        except httpx.HTTPError:
            return None
        total = 0.0
        for line in body.splitlines():
            if line.startswith("flashsale_realign_republished_total{") and f'"{self.product_id}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def dead_letters(self) -> dict[str, int]:
        """The dead-letter queue's orders by kind: ``sale`` (an order of the sale), ``canary``,
        ``other`` (the poison flood); read off the queue (it is the case's own)."""
        kinds: Counter[str] = Counter()
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            channel = await connection.channel()
            queue = await channel.get_queue(self.settings.amqp.dead_letter_queue)
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                try:  # a group the broker dead-lettered whole counts once per order
                    products = [order.product_id for order in orders_of(message.body)]
                except msgspec.MsgspecError:
                    products = [-1]
                for product in products:
                    kind = "sale" if product == self.product_id else "canary" if product == self.canary_id else "other"
                    kinds[kind] += 1
        finally:
            await connection.close()
        return dict(kinds)

    async def queue_depth(self) -> int:
        connection = await aio_pika.connect(self.settings.amqp.url)
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(self.settings.amqp.queue, passive=True)
            return queue.declaration_result.message_count or 0
        finally:
            await connection.close()

    # -- the verdict ------------------------------------------------------------------------------

    async def _settled(self, accepted_ids: list[str]) -> dict[str, Any] | None:
        """What is not settled yet (None when everything is): rows, journal, Redis = MySQL."""
        assert self.engine is not None and self.store is not None
        try:
            present = await self._present(accepted_ids)
            journal = await self.store.stock.journal(self.product_id)
            redis_stock = await self.store.stock.units(self.product_id)
            quota = await self.store.stock.quota(self.product_id)
            async with self.engine.connect() as conn:
                stock = (
                    await conn.execute(
                        text("SELECT stock FROM inventory WHERE product_id = :p"), {"p": self.product_id}
                    )
                ).scalar_one()
                held = {
                    user_id: int(units)
                    for user_id, units in await conn.execute(
                        _HELD_BY_USER, {"p": self.product_id, "released": [OrderStatus.REJECTED, OrderStatus.CANCELLED]}
                    )
                }
            depth = await self.queue_depth()
        except Exception as exc:
            return {"error": repr(exc)[:200]}
        waiting = {
            "without_row": len(accepted_ids) - len(present),
            "journal": len(journal),
            "redis_stock": redis_stock,
            "mysql_stock": stock,
            "quota_mismatches": sum(
                1 for user in held.keys() | quota.keys() if held.get(user, 0) != quota.get(user, 0)
            ),
            "queued": depth,
        }
        if (
            waiting["without_row"] == 0
            and waiting["journal"] == 0
            and redis_stock == stock
            and waiting["quota_mismatches"] == 0
            and depth == 0
        ):
            return None
        return waiting

    async def finish(self) -> Row:
        """Wait for the load and for the sale to settle; the row of the table."""
        row = Row(self.fault)
        if self.load_task is not None:
            await self.load_task
        if self.fault_end is None:
            self.fault_end = self.fault_start or monotonic()
        quiet = max(self.fault_end, self.load_end or monotonic())
        summary = summarize(
            self.buyers.jobs, [o or Answer(0, "not_sent", None, None, 0.0) for o in self.buyers.outcomes]
        )
        accepted_ids = [order.request_id for order in summary.accepted.values()]

        # settle: every 202 has its row, Redis = MySQL, the journal and the queue empty
        settled_at = None
        last: dict[str, Any] | None = None
        while monotonic() - quiet < RECOVERY_TIMEOUT:
            last = await self._settled(accepted_ids)
            if last is None:
                settled_at = monotonic()
                break
            await asyncio.sleep(0.5)
        # the stranded-reservation bound runs at least its length past the fault
        while monotonic() < quiet + STRANDED_BOUND + 1.5:
            await asyncio.sleep(0.25)
        ready_now = await self.ready(timeout=10)

        assert self.engine is not None
        async with self.engine.connect() as conn:
            rows = list(await conn.execute(order_queries.OF_PRODUCT, {"p": self.product_id}))
            stock, sold = (
                await conn.execute(
                    text("SELECT stock, sold FROM inventory WHERE product_id = :p"), {"p": self.product_id}
                )
            ).one()
        by_request: dict[str, list[Any]] = {}
        for r in rows:
            by_request.setdefault(r.request_id, []).append(r)
        told = {order.request_id: (order_no, order) for order_no, order in summary.accepted.items()}

        # lost: no row for the 202's request, or GET /orders/{order_no} does not show the order written
        unread = await self._unreadable(summary)
        lost = {rid for rid in told if rid not in by_request} | unread
        duplicates = sum(len(found) - 1 for found in by_request.values() if len(found) > 1)
        differing = sum(
            1
            for rid, (order_no, order) in told.items()
            for r in by_request.get(rid, [])[:1]
            if (r.user_id, r.quantity) != (order.user, order.quantity)
        )
        no_202 = sum(1 for rid in by_request if rid not in told)
        held: Counter[str] = Counter()
        for r in rows:
            if r.status not in (OrderStatus.REJECTED, OrderStatus.CANCELLED):
                held[r.user_id] += r.quantity
        units = sum(held.values())

        row.accepted = len(summary.accepted)
        row.rows = len(rows)
        row.lost = len(lost)
        row.duplicate = duplicates + summary.answer_conflicts + differing
        row.no_202 = no_202
        row.oversold = max(units - STOCK, sold - STOCK, 0)
        row.over_limit = sum(1 for units_held in held.values() if units_held > LIMIT)
        row.stranded = len(self.stranded)

        # recovered by itself
        checks: list[str] = []
        if settled_at is None:
            checks.append(f"not settled {RECOVERY_TIMEOUT:.0f}s after the load: {json.dumps(last)}")
        if not ready_now:
            checks.append("API not ready at the end")
        if self.supervisor.exits:
            checks.append("exited: " + ", ".join(sorted(set(self.supervisor.exits))))
        try:
            dead = await self.dead_letters()
        except Exception as exc:
            dead = {"error": 1}
            checks.append(f"dead-letter queue unreadable: {exc!r}")
        if dead.get("sale") or dead.get("canary"):
            checks.append(f"dead-lettered orders: {dead.get('sale', 0)} of the sale, {dead.get('canary', 0)} canary")
        recovered_at = next(
            (
                entry["row"]
                for entry in sorted(self.canary, key=lambda e: e["sent"])
                if entry["sent"] >= self.fault_end and entry["row"] is not None
            ),
            None,
        )
        if recovered_at is None:
            checks.append("no purchase accepted and written after the fault")
        for check in self.extra_checks:
            problem = await check()
            if problem:
                checks.append(problem)
        served = availability.measure(self.buyers.tries)
        own = self.recovery if self.recovery is not None else self.fault_end - (self.fault_start or self.fault_end)
        if problem := availability.verdict(served, own):
            checks.append(problem)
        if silent := availability.silent_windows(served.windows, self.supervisor.log_text("api")):
            since = silent[0].start - (self.fault_start or silent[0].start)
            checks.append(f"{len(silent)} 503 windows without a logged cause, the first {since:.1f}s after the fault")
        row.share_503, row.longest_503 = served.share, served.longest_worker
        row.recovered = not checks
        row.time_to_recover = None if recovered_at is None else round(max(recovered_at - self.fault_end, 0.0), 1)
        row.failed_checks = checks + self.notes

        answers = Counter(o.code for o in self.buyers.outcomes if o is not None)
        row.details = {
            "run_id": self.run_id,
            "answers": dict(answers),
            "tries": len(self.buyers.tries),
            "tries_503": sum(1 for t in self.buyers.tries if t.status == 503),
            **served.details(),
            "mysql_stock": stock,
            "mysql_sold": sold,
            "units_held": units,
            "unreadable_202s": len(unread),
            "conflicting_202s": summary.answer_conflicts,
            "rows_differing_from_202": differing,
            "dead_letters": dead,
            "republished": await self.republished(),
            "canary_orders": len(self.canary),
            "canary_longest_wait_for_row": self.longest_canary_wait(),
            "settled_after_load_seconds": None if settled_at is None else round(settled_at - quiet, 1),
            "process_starts": {name: entry.starts for name, entry in self.supervisor._processes.items()},
            "logs": str(self.log_dir),
        }
        return row

    def longest_canary_wait(self, after: float | None = None) -> float | None:
        """Seconds from a canary's 202 to its row, the longest (orders accepted after ``after``)."""
        waits = [
            (entry["row"] if entry["row"] is not None else monotonic()) - entry["accepted"]
            for entry in self.canary
            if after is None or entry["accepted"] >= after
        ]
        return round(max(waits), 1) if waits else None

    async def _unreadable(self, summary: Any) -> set[str]:
        """Request ids of 202s whose ``GET /orders/{order_no}`` (as the buyer) does not answer
        200 with the order written (a ``queued`` answer comes from Redis: no row yet)."""
        bad: set[str] = set()
        gate = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=self.url, timeout=15, trust_env=False) as http:

            async def read(order_no: str, request_id: str, user: str) -> None:
                async with gate:
                    for _ in range(3):
                        try:
                            response = await http.get(
                                f"/api/v1/orders/{order_no}", headers={"Authorization": self.buyers.token(user)}
                            )
                        except httpx.HTTPError:
                            await asyncio.sleep(0.5)
                            continue
                        if response.status_code == 200 and response.json().get("status") != "queued":
                            return
                        if response.status_code not in (503,):
                            break
                        await asyncio.sleep(0.5)
                    bad.add(request_id)

            await asyncio.gather(
                *(read(order_no, order.request_id, order.user) for order_no, order in summary.accepted.items())
            )
        return bad

    def readiness_lie(self, after: float) -> float:
        """The longest stretch after ``after`` in which readiness said 200 while every purchase
        (buyers' tries) answered 503: seconds."""
        longest, start = 0.0, None
        events = sorted(
            [(t, "ready", s) for t, s in self.readiness if t >= after]
            + [(t.at, "buy", t.status) for t in self.buyers.tries if t.at >= after]
        )
        ready_ok = False
        for at, kind, status in events:
            if kind == "ready":
                ready_ok = status == 200
                if not ready_ok:
                    start = None
                continue
            if status == 503 and ready_ok:
                start = at if start is None else start
                longest = max(longest, at - start)
            elif status != 503:
                start = None
        return longest


def format_row(row: Row) -> list[str]:
    recover = "-" if row.time_to_recover is None else f"{row.time_to_recover:.1f} s"
    return [
        row.fault,
        str(row.accepted),
        str(row.rows),
        str(row.lost),
        str(row.duplicate),
        str(row.no_202),
        str(row.oversold),
        str(row.over_limit),
        str(row.stranded),
        "yes" if row.recovered else "no",
        recover,
        f"{row.share_503:.1%}",
        f"{row.longest_503:.1f} s",
        "; ".join(row.failed_checks)[:400],
    ]


HEADERS = [
    "fault",
    "accepted",
    "rows",
    "lost",
    "duplicate",
    "no 202",
    "oversold",
    "over-limit",
    "stranded",
    "recovered by itself",
    "time to recover",
    "503 share",
    "longest 503 window",
    "failed checks",
]
