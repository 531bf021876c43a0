"""Async engine; MySQL's side of the failure vocabulary (docs/ARCHITECTURE.md, "Failure vocabulary").

The engine is the boundary where SQLAlchemy/asyncmy errors become the vocabulary of
:mod:`service.failures` (the idea of advanced-alchemy's 1062 mapping, for every error that
means something to a caller): its ``handle_error`` hook (:func:`_translated`) raises
:class:`~service.failures.TransientConflict` for a deadlock or lock wait timeout,
:class:`~service.failures.DuplicateKey` for a 1062 and
:class:`~service.failures.StoreUnavailable` ``("mysql")`` for a server that cannot be reached or
went away. Any other database error (a bug, a schema the code does not expect) stays SQLAlchemy's,
and so does the pool's ``TimeoutError`` (no pooled connection in time: SQLAlchemy raises it
outside the hook), which the classifier counts as MySQL unavailable.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import structlog
from sqlalchemy import TextClause, event
from sqlalchemy.dialects.mysql.asyncmy import dialect as asyncmy_dialect
from sqlalchemy.engine import Dialect, ExceptionContext
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.failures import TransientConflict, translate

ER_CONNECTION_LOST = 2013
MAX_TRANSACTION_ATTEMPTS = 6
"""Attempts of one transaction that meets deadlocks or lock wait timeouts (:func:`in_transaction`)."""

T = TypeVar("T")
log = structlog.get_logger(__name__)


async def in_transaction(
    engine: AsyncEngine,
    work: Callable[[AsyncConnection], Awaitable[T]],
    *,
    label: str,
    attempts: int = MAX_TRANSACTION_ATTEMPTS,
    on_retry: Callable[[], None] | None = None,
) -> T:
    """``work(conn)`` in one transaction (committed when it returns, rolled back when it raises),
    the whole transaction retried on a :class:`~service.failures.TransientConflict` (deadlock
    1213, lock wait timeout 1205), at most ``attempts`` times, with jittered exponential
    back-off (40 ms doubling, capped at 1 s).
    ``label`` names the work in the retry log line; ``on_retry`` is called before each retry
    (e.g. a metric).

    Raises:
        service.failures.TransientConflict: retries exhausted.
        service.failures.StoreFailure: MySQL failed otherwise (:mod:`service.failures`).
        Whatever ``work`` raises otherwise (after the rollback).
    """
    for attempt in range(1, attempts + 1):
        try:
            async with engine.begin() as conn:
                return await work(conn)
        except TransientConflict:
            if attempt == attempts:
                raise
            delay = min(0.02 * 2**attempt, 1.0) * (0.5 + random.random())
            if on_retry is not None:
                on_retry()
            log.info("transaction_retry", work=label, attempt=attempt, delay=round(delay, 3))
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


_DRIVER_DIALECT = asyncmy_dialect(paramstyle="pyformat")


class DriverStatement:
    """A ``text()`` statement of the consumer's batch transaction compiled once into asyncmy's
    own form (``%(name)s`` placeholders), run by :func:`on_driver`. Still parameterised: the
    driver escapes every parameter as SQLAlchemy would have it do."""

    __slots__ = ("sql",)

    def __init__(self, statement: TextClause) -> None:
        self.sql = str(statement.compile(dialect=_DRIVER_DIALECT))
        if "POSTCOMPILE" in self.sql:
            raise ValueError("an expanding parameter needs SQLAlchemy: run it with conn.execute")


async def on_driver(
    conn: AsyncConnection, statement: DriverStatement, params: Mapping[str, Any]
) -> tuple[int, list[tuple[Any, ...]]]:
    """Run ``statement`` inside ``conn``'s transaction on the pooled connection's asyncmy
    connection: its row count (matched rows: the dialect's ``FOUND_ROWS`` flag) and its rows.
    SQLAlchemy's statement execution (compiled-cache look-up, parameter processing, result
    wrapping, the async adaptation) costs about three times asyncmy's own work for each
    statement (docs/BENCHMARKS.md, "The consumer drain"); the transaction, the pool and its
    pre-ping stay SQLAlchemy's. The errors are the engine's vocabulary, as :func:`_translated`
    makes them, but the engine's ``handle_error`` listeners do not see them (a connection lost
    here is found by the rollback, or by the next pre-ping).

    Raises:
        service.failures.StoreFailure: as a statement run through the engine raises it.
    """
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None, "a connection in a transaction has its driver connection"
    try:
        async with driver.cursor() as cursor:
            count = await cursor.execute(statement.sql, params)
            return count, await cursor.fetchall()
    except Exception as exc:
        failure = translate(exc)
        if failure is None or failure is exc:
            raise
        raise failure from exc


def make_engine(
    url: str, *, pool_size: int = 20, max_overflow: int = 10, idle_session_seconds: int | None = None
) -> AsyncEngine:
    """One pooled engine per process (no connection set-up per request).

    ``url``: ``mysql+asyncmy://...``; ``pool_size``/``max_overflow``: connections kept / allowed
    beyond; ``idle_session_seconds``: the sessions' ``wait_timeout`` (the server's own when None):
    the server closes a session idle that long and rolls back its open transaction, so a process
    stopped mid-transaction (paused, its host frozen) holds its row locks no longer than that.
    A pooled connection the server closed meanwhile is replaced when next checked out (pre-ping).
    """
    # Every timestamp the service writes or compares (CURRENT_TIMESTAMP, NOW()) is UTC.
    session = "SET time_zone = '+00:00'"
    if idle_session_seconds is not None:
        session += f", wait_timeout = {int(idle_session_seconds)}"
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"init_command": session},
    )
    event.listen(engine.sync_engine, "do_connect", connect_typed)
    event.listen(engine.sync_engine, "handle_error", _translated, retval=True)
    return engine


def _translated(context: ExceptionContext) -> BaseException | None:
    """SQLAlchemy's ``handle_error`` hook: the vocabulary's exception for a DBAPI error that means
    something to callers (:func:`service.failures.translate`), raised in its place (chained:
    other hooks still see the original), with the driver's error as its cause. Not for the
    pool's pre-ping, whose failure SQLAlchemy handles by reconnecting."""
    if context.is_pre_ping:
        return None
    return translate(context.sqlalchemy_exception or context.original_exception)


def connect_typed(dialect: Dialect, _record: object, cargs: list[Any], cparams: dict[str, Any]) -> Any:
    """SQLAlchemy's ``do_connect`` hook: the dialect's own connect, with asyncmy's bare
    ``RuntimeError`` for a socket the server closed during the handshake (seen when MariaDB
    refuses a connection past ``max_connections``: "Transport does not expose socket instance")
    raised as the DBAPI's ``OperationalError`` 2013 (connection lost), so every caller sees a
    database outage (503 on the API) instead of an unknown error (500).

    Raises:
        The DBAPI's ``OperationalError`` (which :func:`_translated` turns into
        :class:`~service.failures.StoreUnavailable` ``("mysql")``).
    """
    try:
        return dialect.connect(*cargs, **cparams)
    except RuntimeError as exc:
        raise dialect.loaded_dbapi.OperationalError(
            ER_CONNECTION_LOST, f"Lost connection to MySQL while connecting: {exc}"
        ) from exc
