"""Starting while a store may be away: the start-up check of the stores, and opening a process's
resources through the one wait with back-off (:func:`service.runtime.when_reachable`) that
every long-running command uses (``serve``'s workers, ``consume``, ``realign --watch``,
``sweep --watch``; the consumer's broker connection too).

What counts as "away" is :mod:`service.failures`' classifier (docs/ARCHITECTURE.md, "Failure
vocabulary"): a store that is down, restarting, unreachable or timing out is waited for; one that
refuses as configured (wrong credentials, unknown database) ends the command with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar
from urllib.parse import urlsplit

from sqlalchemy import text

from db.engine import make_engine
from service.adapters.broker_connection import connect_once, quiet_connect_logs
from service.adapters.redis.client import make_redis
from service.bootstrap import ApiWorker, Job, Resources, open_api, open_job, opened
from service.domain.order_numbers.minter import ShardsExhausted
from service.environment_errors import ConfigError
from service.failures import (
    STORE_NAMES,
    PublishFailed,
    Store,
    StoreUnavailable,
    failure_of,
    is_outage,
    outage_of,
)
from service.runtime import Backoff, OutageLog, stop_signal, stop_task, when_reachable
from service.settings import Settings

R = TypeVar("R", bound=Resources)


class DependencyUnreachable(ConfigError):
    """A store named by a setting did not answer. ``str()`` is one line: what, which variable, why."""


_VARIABLES = {"redis": "FLASHSALE_REDIS__URL", "mysql": "FLASHSALE_DB__URL", "rabbitmq": "FLASHSALE_AMQP__URL"}


def where(url: str) -> str:
    """``host:port`` (or the path of a socket) of a store URL, without credentials."""
    parts = urlsplit(url)
    return parts.netloc.rsplit("@", 1)[-1] or parts.path or url.split("://", 1)[0]


def unreachable(exc: BaseException, settings: Settings) -> DependencyUnreachable | None:
    """The one-line :class:`DependencyUnreachable` for an exception that means a store named by
    the settings cannot be reached (MySQL, Redis or RabbitMQ, :class:`StoreUnavailable`); None
    for any other exception."""
    failure = failure_of(exc)  # exc itself when it is already in the vocabulary
    if isinstance(failure, PublishFailed) and failure.__cause__ is not None:
        failure = failure_of(failure.__cause__)  # a publish not confirmed: unreachable only if its cause says so
    if not isinstance(failure, StoreUnavailable):
        return None
    url = {"redis": settings.redis.url, "mysql": settings.db.url, "rabbitmq": settings.amqp.url}[failure.store]
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0][:200]
    if isinstance(exc, StoreUnavailable) and failure.detail:
        reason = failure.detail
    what = STORE_NAMES[failure.store]
    return DependencyUnreachable(f"{_VARIABLES[failure.store]}: cannot reach {what} at {where(url)}: {reason}")


async def check_dependencies(settings: Settings, *, redis: bool = True, amqp: bool = True, mysql: bool = True) -> None:
    """Connect once to each store the process needs (Redis PING, a RabbitMQ connection, MySQL
    ``SELECT 1``), in that order, each bounded by its connect timeout: the start-up check of
    ``flashsale serve`` and ``consume``, so that a wrong URL ends in one line instead of workers
    crashing and being respawned.

    Raises:
        DependencyUnreachable: the first store that did not answer.
    """
    try:
        if redis:
            client = make_redis(settings)
            try:
                await client.ping()
            finally:
                await client.aclose()
        if amqp:
            # aiormq logs the refused connect itself; the error raised says it once, in one line
            with quiet_connect_logs():
                connection = await connect_once(settings.amqp)
            await connection.close()
        if mysql:
            engine = make_engine(settings.db.url, pool_size=1, max_overflow=0)
            try:
                async with engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
            finally:
                await engine.dispose()
    except Exception as exc:
        problem = unreachable(exc, settings)
        if problem is None:
            raise
        raise problem from exc


async def probe_dependencies(settings: Settings) -> dict[Store, BaseException | None]:
    """Ask Redis, RabbitMQ and MySQL side by side, once each (:func:`check_dependencies`):
    ``{"redis": None | error, "rabbitmq": ..., "mysql": ...}``; never raises for a store that
    does not answer."""
    checks: dict[Store, Awaitable[None]] = {
        "redis": check_dependencies(settings, amqp=False, mysql=False),
        "rabbitmq": check_dependencies(settings, redis=False, mysql=False),
        "mysql": check_dependencies(settings, redis=False, amqp=False),
    }
    results = await asyncio.gather(*checks.values(), return_exceptions=True)
    found: dict[Store, BaseException | None] = {}
    for name, result in zip(checks, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # cancelled
        found[name] = result if isinstance(result, BaseException) else None
    return found


async def report_dependencies(settings: Settings) -> list[str]:
    """``flashsale serve``'s start-up check: every store asked once (:func:`probe_dependencies`);
    one line per store that is away (what, where, which variable, why), returned for the caller
    to print; the API starts all the same and its readiness says 503 until they answer.

    Raises:
        DependencyUnreachable: a store refused as configured (wrong credentials, unknown
            database): the first such one.
    """
    away = []
    for error in (await probe_dependencies(settings)).values():
        if error is None:
            continue
        if not is_outage(error):
            raise error
        away.append(str(error))
    return away


async def open_when_reachable(
    settings: Settings,
    build: Callable[[Settings], Awaitable[R]],
    stop: asyncio.Event | None = None,
    *,
    check: bool = False,
) -> R | None:
    """``build(settings)`` (a builder of :mod:`service.bootstrap`) once the stores answer
    (:func:`when_reachable`); with ``check``, each attempt first asks every store, RabbitMQ
    included (:func:`check_dependencies`: the consumer's own connection needs it though its
    builder opens no publisher). None when ``stop`` was set first. Close the result.

    Raises:
        DependencyUnreachable: with ``check``, a store refused as configured.
        Whatever ``build`` raises that is no outage (:func:`service.failures.is_outage`).
    """

    async def attempt() -> R:
        if check:
            await check_dependencies(settings)
        return await build(settings)

    return await when_reachable(attempt, stop)


@asynccontextmanager
async def opened_when_reachable(
    settings: Settings, build: Callable[[Settings], Awaitable[R]], *, check: bool = False
) -> AsyncIterator[R | None]:
    """``async with opened_when_reachable(settings, open_consumer) as resources``: for a
    long-running command started while a store may be away (``consume``, ``realign --watch``,
    ``sweep --watch``): :func:`open_when_reachable` until SIGTERM/SIGINT (then ``resources`` is
    None: stop at once), closed on exit."""
    with stop_signal() as stop:
        resources = await open_when_reachable(settings, build, stop, check=check)
    try:
        yield resources
    finally:
        if resources is not None:
            await resources.close()


class BackgroundResources:
    """The API worker's resources, opened in a task of their own so that a worker starts (and
    answers ``/health/live``, and ``/health/ready`` 503) while Redis or RabbitMQ is away:
    granian never sees a start-up failure, so there is no crash loop. The task tries
    :func:`~service.bootstrap.open_api` with back-off (:func:`when_reachable`, 0.5 s doubling to
    :data:`OPEN_BACKOFF_CAP` s), one log line when the wait begins and one when it ends.
    ``current`` is None until it succeeds; meanwhile ``reachable`` says which stores answered the
    last attempt (for readiness). ``on_no_shard``: called when an attempt (the first or a
    background one) finds every order-number shard leased (the API stops its server:
    :func:`service.api.no_shard.stop_server`)."""

    OPEN_BACKOFF_CAP = 3.0
    OPEN_TIMEOUT = 15.0

    def __init__(self, settings: Settings, *, on_no_shard: Callable[[ShardsExhausted], None] | None = None) -> None:
        self._settings = settings
        self._on_no_shard = on_no_shard
        self.current: ApiWorker | None = None
        self.reachable: dict[Store, bool] = {"redis": False, "rabbitmq": False, "mysql": False}
        self._task: asyncio.Task[None] | None = None
        self._waiting = OutageLog("dependency", process="api")

    async def start(self) -> None:
        """Try once now (at most :data:`OPEN_TIMEOUT` seconds: a worker whose stores answer
        starts ready, as before); if that fails, go on trying in a background task. Never
        raises for a store that fails.

        Raises:
            ShardsExhausted: every order-number shard is leased (no outage: waiting frees none),
                after ``on_no_shard`` was told; met later, it ends the background task the same way.
        """
        try:
            self.current = await self._open()
        except ShardsExhausted:
            raise
        except Exception as exc:
            self._waiting.failed(exc, store=outage_of(exc) or "unknown")
            self._task = asyncio.create_task(self._keep_trying())
            return
        self._waiting.recovered()

    async def _open(self) -> ApiWorker:
        """One attempt; on a failure, which stores answer is asked (``reachable``)."""
        try:
            return await asyncio.wait_for(open_api(self._settings), self.OPEN_TIMEOUT)
        except ShardsExhausted as exc:  # not an outage: waiting frees no shard
            if self._on_no_shard is not None:
                self._on_no_shard(exc)
            raise
        except Exception:
            with contextlib.suppress(Exception):
                found = await probe_dependencies(self._settings)
                self.reachable = {name: error is None for name, error in found.items()}
            raise

    async def _keep_trying(self) -> None:
        # An API worker keeps trying whatever failed but a shard shortage: its readiness says so.
        self.current = await when_reachable(
            self._open,
            backoff=Backoff(cap=self.OPEN_BACKOFF_CAP),
            waiting=self._waiting,
            survive=lambda exc: not isinstance(exc, ShardsExhausted),
        )

    async def close(self) -> None:
        """Stop opening; close what was opened."""
        if self._task is not None:
            await stop_task(self._task)
        if self.current is not None:
            await self.current.close()
            self.current = None


@asynccontextmanager
async def job_opened(settings: Settings, *, publish: bool = True, wait: bool = False) -> AsyncIterator[Job | None]:
    """``async with job_opened(settings) as job``: :func:`open_job`, closed on exit. With
    ``wait`` (a command that repeats: ``realign --watch``, ``sweep --watch``) it waits for the
    stores first (:func:`opened_when_reachable`); ``job`` is None when SIGTERM/SIGINT came first."""
    if not wait:
        async with opened(open_job(settings, publish=publish)) as job:
            yield job
        return
    async with opened_when_reachable(settings, functools.partial(open_job, publish=publish)) as job:
        yield job
