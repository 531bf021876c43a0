"""structlog set-up: JSON lines on stderr, for structlog's loggers and the standard library's
(libraries, granian) alike, each line carrying the HTTP request id of the request it belongs to.

``HTTP_REQUEST_ID`` holds the request id of the HTTP request being served (the ``X-Request-ID``
it came with, or one minted for it; see :mod:`service.api.request_telemetry`); log lines written while it
is set carry it as ``http_request_id``, and the publisher sends it with the order message (AMQP
``correlation_id``), so the consumer's lines name it too. ``request_id`` in log lines is the
order's request id (its idempotency key), as everywhere else in flashsale.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TextIO, cast

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

HTTP_REQUEST_ID: ContextVar[str | None] = ContextVar("http_request_id", default=None)


def _add_http_request_id(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    request_id = HTTP_REQUEST_ID.get()
    if request_id is not None:
        event.setdefault("http_request_id", request_id)
    return event


STORM_EVENTS = frozenset(
    {
        "order_no_unavailable",
        "reserve_failed",
        "database_purchase_failed",
        "give_token_failed",
        "mark_queued_failed",
        "publish_failed",
        "republish_failed",
        "store_unavailable",
        "unavailable_answered",
    }
)
"""Events that every request repeats while a store is lost (a stampede would write thousands a
second): :class:`StormThrottle` lets one per second through."""


class StormThrottle:
    """A structlog processor: at most one line per ``seconds`` for each event in ``events`` and
    each ``cause`` it names (so every cause of a storm is told at least once a second); the next
    line let through after a quiet spell carries ``suppressed`` (lines dropped since).
    Every other event passes untouched. ``clock`` is monotonic seconds (injectable for tests).
    The requests themselves are still answered (503) and counted (metrics); only the log stays
    readable while Redis, RabbitMQ or MySQL is away."""

    def __init__(
        self, events: frozenset[str] = STORM_EVENTS, seconds: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._events = events
        self._seconds = seconds
        self._clock = clock
        self._next: dict[tuple[str, object], float] = {}
        self._suppressed: dict[tuple[str, object], int] = {}

    def __call__(self, _: WrappedLogger, __: str, event: EventDict) -> EventDict:
        name = event.get("event")
        if name not in self._events:
            return event
        key = (name, event.get("cause"))
        now = self._clock()
        if now < self._next.get(key, 0.0):
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            raise structlog.DropEvent
        self._next[key] = now + self._seconds
        if dropped := self._suppressed.pop(key, 0):
            event["suppressed"] = dropped
        return event


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        _add_http_request_id,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def json_formatter() -> logging.Formatter:
    """A standard-library formatter that writes records as the same JSON lines as structlog
    (``logger`` names the library's logger)."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared_processors(), structlog.stdlib.add_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )


def granian_logging() -> dict[str, Any]:
    """granian's ``log_dictconfig``: its own lines (start-up, workers, errors) as JSON on stderr."""
    handler = {"()": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "json"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {name: {"()": json_formatter} for name in ("json", "generic", "access")},
        "handlers": {"console": handler, "access": handler},
        "loggers": {
            "_granian": {"handlers": ["console"], "level": "INFO", "propagate": False},
            "granian.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }


class _CurrentStderr:
    """``sys.stderr`` as it is at each write. Whoever swaps ``sys.stderr`` (a test runner's capture,
    an embedding host) may close the old stream; a logger that kept it would raise
    ``ValueError: I/O operation on closed file`` from inside a log call, turning a warning on an
    error path into a 500."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


STDERR = cast(TextIO, _CurrentStderr())  # write and flush: all PrintLogger and StreamHandler call


def configure_logging(level: str = "INFO") -> None:
    """Log JSON lines at ``level`` (``DEBUG``, ``INFO``, ``WARNING``...) on stderr: structlog's
    loggers and, through :func:`json_formatter`, the standard library's root logger."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            StormThrottle(),
            *_shared_processors(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(STDERR),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    if not any(isinstance(handler, _JSONHandler) for handler in root.handlers):
        handler = _JSONHandler(STDERR)
        handler.setFormatter(json_formatter())
        root.addHandler(handler)
    root.setLevel(numeric)


class _JSONHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root logger's JSON handler (told apart so that configuring twice adds it once)."""
