"""The failure vocabulary: what a store's failure means to the rest of the service, and the one
classifier that reads it (docs/ARCHITECTURE.md, "Failure vocabulary").

The types. Each adapter translates its driver's exceptions into them at its own boundary, once
(MySQL: the engine's ``handle_error`` hook and its pool, :func:`db.engine.make_engine`; Redis: the
Redis adapter's methods; RabbitMQ: the publisher, the router and the dead-letter queue), so
the domain and the edges catch only these, never a driver's exception:

- :class:`StoreUnavailable` ``(store)``: not reached, or no answer in time; the call may or may
  not have taken effect. :class:`StoreRefused` is the kind that waiting does not cure (wrong
  credentials, unknown database); :class:`PublishFailed` is RabbitMQ's not-confirmed publish.
- :class:`StoreError`: the store answered with an error that is no outage (a Redis error reply,
  a MySQL statement error): a ``500`` outside the purchase path, as a bug is.
- :class:`TransientConflict`: MySQL chose the transaction as a deadlock victim or its lock wait
  timed out; nothing was written, running the whole transaction again may succeed.
- :class:`DuplicateKey`: an insert met a UNIQUE index.

The classifier (:func:`failure_of`, :func:`outage_of`, :func:`is_unavailable`,
:func:`is_transient`) decides "a store is away" for every caller: the API's ``503 unavailable``,
the consumer's retry queue, the start-up wait and the ``--watch`` loops. It knows the vocabulary
and, for errors raised before any adapter saw them (a raw client in a start-up check, a test),
the drivers' own exceptions through :func:`translate`, the one table of driver errors.

``unavailable`` is also an answer of the HTTP contract (``503``, code ``unavailable``,
``Retry-After``): :data:`UNAVAILABLE` is its code and :func:`unavailable_detail` its wording.
"""

from __future__ import annotations

from typing import Literal

Store = Literal["redis", "mysql", "rabbitmq"]
STORE_NAMES: dict[Store, str] = {"redis": "Redis", "mysql": "MySQL", "rabbitmq": "RabbitMQ"}
"""How a store is named in log lines and one-line errors."""

UNAVAILABLE = "unavailable"
"""The error code of the HTTP contract for "a store failed, retry shortly" (``503``)."""
UNAVAILABLE_RETRY_AFTER = 1
"""Seconds an ``unavailable`` answer tells the client to wait (``Retry-After``)."""


def unavailable_detail(what: str = "Stock service") -> str:
    """The detail of an ``unavailable`` answer: ``"<what> unavailable, retry shortly."``."""
    return f"{what} unavailable, retry shortly."


class StoreFailure(Exception):
    """A store did not do what was asked; the subclass says what the caller may assume.
    ``store`` names the store."""

    store: Store


class StoreUnavailable(StoreFailure):
    """``store`` could not be reached or did not answer in time. The call may or may not have
    taken effect (a reply lost on the wire): callers that wrote compensate or leave it to
    realignment."""

    def __init__(self, store: Store, detail: str = "") -> None:
        super().__init__(f"{store} unavailable" + (f": {detail}" if detail else ""))
        self.store: Store = store
        self.detail = detail


class StoreRefused(StoreUnavailable):
    """``store`` answered but refused the service as configured (wrong credentials, unknown
    database): unavailable all the same, but no outage that waiting would end."""


class StoreError(StoreFailure):
    """``store`` answered, with an error that is neither an outage nor a conflict: a Redis error
    reply (OOM, READONLY, WRONGTYPE, a script error), a MySQL statement error (a schema the code
    does not expect, a value out of range, a statement timeout). Not ``503 unavailable`` outside
    the purchase path, and no outage to wait for. ``transient``: MySQL's
    ``OperationalError``/``InterfaceError`` kind, which the consumer retries rather than
    dead-letters (a schema being migrated under it)."""

    def __init__(self, store: Store, detail: str = "", *, transient: bool = False) -> None:
        super().__init__(f"{store} error" + (f": {detail}" if detail else ""))
        self.store = store
        self.detail = detail
        self.transient = transient


class PublishFailed(StoreFailure):
    """RabbitMQ did not confirm a message (nack, unroutable, no confirm in time, connection or
    channel down). The message may still have reached the broker after a timeout: the
    outcome is unknown, and the consumer's claim on the reservation settles it. An outage for
    the ``--watch`` loops; for the one-line start-up errors only when its cause is one."""

    store: Store = "rabbitmq"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class TransientConflict(StoreFailure):
    """MySQL chose this transaction as a deadlock victim or its lock wait timed out (1213, 1205):
    nothing was written; running the whole transaction again may succeed."""

    store: Store = "mysql"


class DuplicateKey(StoreFailure):
    """An insert met a UNIQUE index (MySQL error 1062); ``key`` names the index when known."""

    store: Store = "mysql"

    def __init__(self, key: str | None, detail: str = "") -> None:
        super().__init__(detail or f"duplicate key {key}")
        self.key = key


# --- MySQL error numbers -------------------------------------------------------------------

ER_DUP_ENTRY = 1062
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
MYSQL_REFUSED = frozenset({1044, 1045, 1049, 1698})
"""Access denied (1044, 1045; 1698: a user that does not exist, or one that logs in only over
the unix socket, as root on a fresh Debian MariaDB), unknown database (1049): MySQL refuses as
configured."""
MYSQL_AWAY = frozenset({1040, 1053, 1290, 1927, 2002, 2003, 2005, 2006, 2013, 2055, 4031})
"""Too many connections (1040), shutdown in progress (1053), read-only while failing over
(1290), connection killed (1927), cannot connect / host unknown / gone away / lost (2002-2013,
2055), disconnected for inactivity (4031): MySQL is away, and may come back. Any other
``OperationalError``/``InterfaceError`` and a connection SQLAlchemy invalidated count too."""


def mysql_errno(exc: BaseException | None) -> int | None:
    """The MySQL error number behind a SQLAlchemy/asyncmy exception (or the asyncmy error
    itself), if any."""
    orig = getattr(exc, "orig", None) or exc
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _duplicate_key(exc: BaseException) -> DuplicateKey:
    message = str(getattr(exc, "orig", None) or exc)
    key = message.rsplit("for key '", 1)[1].split("'", 1)[0] if "for key '" in message else None
    return DuplicateKey(key.rsplit(".", 1)[-1] if key else None, message)


def _first_line(exc: BaseException) -> str:
    lines = str(getattr(exc, "orig", None) or exc).splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def translate(exc: BaseException) -> StoreFailure | None:
    """The vocabulary for one driver exception (redis-py, SQLAlchemy/asyncmy, aiormq/aio-pika),
    or None when it is no store failure the vocabulary names (a bug, a schema error, a Redis
    script error). ``exc`` itself when it is already in the vocabulary. Causes are not looked at
    (:func:`failure_of` does)."""
    if isinstance(exc, StoreFailure):
        return exc
    name = type(exc).__module__.split(".", 1)[0]
    if name == "sqlalchemy" or name == "asyncmy":
        return _mysql(exc)
    if name == "redis":
        return _redis(exc)
    if name in ("aiormq", "aio_pika", "pamqp"):
        return _amqp(exc)
    return None


def _mysql(exc: BaseException) -> StoreFailure | None:
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeoutError

    if isinstance(exc, PoolTimeoutError):  # no pooled connection in time
        return StoreUnavailable("mysql", _first_line(exc))
    errno = mysql_errno(exc)
    if errno in (ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT):
        return TransientConflict(_first_line(exc))
    if errno == ER_DUP_ENTRY:
        return _duplicate_key(exc)
    if errno in MYSQL_REFUSED:
        return StoreRefused("mysql", _first_line(exc))
    wrapped = isinstance(exc, DBAPIError)
    if errno in MYSQL_AWAY or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return StoreUnavailable("mysql", _first_line(exc))
    operational = isinstance(exc, OperationalError | InterfaceError) or (
        not wrapped and type(exc).__name__ in ("OperationalError", "InterfaceError")
    )
    if wrapped or errno is not None or operational:  # any other error of the server or the driver
        return StoreError("mysql", _first_line(exc), transient=operational)
    return None  # SQLAlchemy's own (a result with no row, a misused API): a bug


def _redis(exc: BaseException) -> StoreFailure | None:
    from redis.exceptions import (
        AuthenticationError,
        AuthorizationError,
        BusyLoadingError,
        MaxConnectionsError,
        RedisError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, AuthenticationError | AuthorizationError):
        return StoreRefused("redis", _first_line(exc))
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | BusyLoadingError | MaxConnectionsError):
        return StoreUnavailable("redis", _first_line(exc))
    if isinstance(exc, RedisError):  # an error reply: OOM, READONLY, WRONGTYPE, a script's error
        return StoreError("redis", _first_line(exc))
    return None


def _amqp(exc: BaseException) -> StoreFailure | None:
    from aiormq.exceptions import AMQPConnectionError, ChannelInvalidStateError, ProbableAuthenticationError
    from aiormq.exceptions import AuthenticationError as AMQPAuthenticationError

    if isinstance(exc, AMQPAuthenticationError | ProbableAuthenticationError):
        return StoreRefused("rabbitmq", _first_line(exc))
    if isinstance(exc, AMQPConnectionError | ChannelInvalidStateError):
        return StoreUnavailable("rabbitmq", _first_line(exc))
    return None


# --- The classifier -------------------------------------------------------------------------


def failure_of(exc: BaseException) -> StoreFailure | None:
    """The store failure ``exc`` is or wraps (:func:`translate`), looking at its causes too (a
    one-line start-up error wraps the driver's); None when it is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (failure := translate(current)) is not None:
            return failure
        current = current.__cause__ or current.__context__
    return None


def outage_of(exc: BaseException) -> str | None:
    """Which store is away when ``exc`` says one is (``"Redis"``, ``"MySQL"``, ``"RabbitMQ"``, or
    ``"a store"`` for a bare refused connection or timeout), else None: a store that is down,
    restarting, unreachable or timing out may come back, so a long-running process waits for it.
    A publish RabbitMQ did not confirm counts as its outage. A store that refuses as configured
    (:class:`StoreRefused`), an error reply (:class:`StoreError`), a conflict, a duplicate key
    and a bug are no outage. The exception's causes are looked at too."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        failure = translate(current)
        if failure is not None:
            if isinstance(failure, StoreUnavailable | PublishFailed) and not isinstance(failure, StoreRefused):
                return STORE_NAMES[failure.store]
            return None
        if isinstance(current, OSError | TimeoutError):  # refused, reset, timed out: may come back
            return "a store"
        current = current.__cause__ or current.__context__
    return None


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` means a store is away for now (:func:`outage_of`)."""
    return outage_of(exc) is not None


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` is (or is the driver's error for) a store that was not reached or did
    not answer, refusals as configured included: what the API answers ``503 unavailable``."""
    return isinstance(translate(exc), StoreUnavailable)


def is_transient(exc: BaseException) -> bool:
    """A failure that passes by itself: a store unavailable (:func:`is_unavailable`: MySQL
    unreachable, gone away, restarting, read-only while failing over, out of connections), a
    deadlock or lock wait past the transaction's own retries, MySQL's operational errors
    (:attr:`StoreError.transient`), a socket error or timeout."""
    failure = translate(exc)
    return (
        isinstance(failure, StoreUnavailable | TransientConflict)
        or (isinstance(failure, StoreError) and failure.transient)
        or isinstance(exc, OSError | TimeoutError)
    )
