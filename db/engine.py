"""Async engine and typed MySQL errors (the idea of advanced-alchemy's 1062 mapping)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from sqlalchemy import event
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

ER_DUP_ENTRY = 1062
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
ER_CONNECTION_LOST = 2013
MAX_TRANSACTION_ATTEMPTS = 6
"""Attempts of one transaction that meets deadlocks or lock wait timeouts (:func:`in_transaction`)."""

T = TypeVar("T")
log = structlog.get_logger(__name__)


class DuplicateKeyError(Exception):
    """An INSERT hit a UNIQUE index (MySQL error 1062); ``key`` names the index when known."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


def mysql_errno(exc: BaseException) -> int | None:
    """The MySQL error number behind a SQLAlchemy/asyncmy exception, if any."""
    orig = getattr(exc, "orig", None)
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


UNREACHABLE_ERRNOS = frozenset({1040, 1044, 1045, 1049, 2002, 2003, 2005, 2006, 2013})
"""Too many connections (1040), access denied (1044, 1045), unknown database (1049), cannot
connect / host unknown / server gone away / connection lost (2002-2013): MySQL is not reachable
as configured, or not now."""


def is_unreachable(exc: BaseException) -> bool:
    """MySQL could not be reached (a connection error above, or no pooled connection in time)."""
    return isinstance(exc, PoolTimeoutError) or (isinstance(exc, DBAPIError) and mysql_errno(exc) in UNREACHABLE_ERRNOS)


def is_retryable(exc: BaseException) -> bool:
    """Deadlock (1213) or lock wait timeout (1205): the whole transaction may be retried."""
    return isinstance(exc, DBAPIError) and mysql_errno(exc) in (ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT)


async def in_transaction(
    engine: AsyncEngine,
    work: Callable[[AsyncConnection], Awaitable[T]],
    *,
    label: str,
    attempts: int = MAX_TRANSACTION_ATTEMPTS,
    on_retry: Callable[[], None] | None = None,
) -> T:
    """``work(conn)`` in one transaction (committed when it returns, rolled back when it raises),
    the whole transaction retried on a deadlock (1213) or lock wait timeout (1205), at most
    ``attempts`` times, with jittered exponential back-off (40 ms doubling, capped at 1 s).
    ``label`` names the work in the retry log line; ``on_retry`` is called before each retry
    (e.g. a metric).

    Raises:
        sqlalchemy.exc.DBAPIError: a non-retryable database error, or retries exhausted.
        Whatever ``work`` raises otherwise (after the rollback).
    """
    for attempt in range(1, attempts + 1):
        try:
            async with engine.begin() as conn:
                return await work(conn)
        except DBAPIError as exc:
            if not is_retryable(exc) or attempt == attempts:
                raise
            delay = min(0.02 * 2**attempt, 1.0) * (0.5 + random.random())
            if on_retry is not None:
                on_retry()
            log.info("transaction_retry", work=label, attempt=attempt, delay=round(delay, 3))
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def as_duplicate_key(exc: DBAPIError) -> DuplicateKeyError | None:
    """A :class:`DuplicateKeyError` for a 1062 error (``key`` parsed from "for key 'name'"), else None."""
    if mysql_errno(exc) != ER_DUP_ENTRY:
        return None
    message = str(getattr(exc, "orig", exc))
    key = message.rsplit("for key '", 1)[1].split("'", 1)[0] if "for key '" in message else None
    return DuplicateKeyError(key.rsplit(".", 1)[-1] if key else None, message)


def make_engine(url: str, *, pool_size: int = 20, max_overflow: int = 10) -> AsyncEngine:
    """One pooled engine per process (no connection set-up per request).

    ``url``: ``mysql+asyncmy://...``; ``pool_size``/``max_overflow``: connections kept / allowed beyond.
    """
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        pool_recycle=1800,
        # Every timestamp the service writes or compares (CURRENT_TIMESTAMP, NOW()) is UTC.
        connect_args={"init_command": "SET time_zone = '+00:00'"},
    )
    event.listen(engine.sync_engine, "do_connect", connect_typed)
    return engine


def connect_typed(dialect: Dialect, _record: object, cargs: list[Any], cparams: dict[str, Any]) -> Any:
    """SQLAlchemy's ``do_connect`` hook: the dialect's own connect, with asyncmy's bare
    ``RuntimeError`` for a socket the server closed during the handshake (seen when MariaDB
    refuses a connection past ``max_connections``: "Transport does not expose socket instance")
    raised as the DBAPI's ``OperationalError`` 2013 (connection lost), so every caller sees a
    database outage (503 on the API) instead of an unknown error (500).

    Raises:
        The DBAPI's ``OperationalError`` (wrapped by SQLAlchemy as ``sqlalchemy.exc.OperationalError``).
    """
    try:
        return dialect.connect(*cargs, **cparams)
    except RuntimeError as exc:
        raise dialect.loaded_dbapi.OperationalError(
            ER_CONNECTION_LOST, f"Lost connection to MySQL while connecting: {exc}"
        ) from exc
