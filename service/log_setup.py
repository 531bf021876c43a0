"""structlog set-up: JSON lines on stderr, for structlog's loggers and the standard library's
(libraries, granian) alike, each line carrying the HTTP request id of the request it belongs to.

``HTTP_REQUEST_ID`` holds the request id of the HTTP request being served (the ``X-Request-ID``
it came with, or one minted for it; see :mod:`service.api.observe`); log lines written while it
is set carry it as ``http_request_id``, and the publisher sends it with the order message (AMQP
``correlation_id``), so the consumer's lines name it too. ``request_id`` in log lines is the
order's request id (its idempotency key), as everywhere else in flashsale.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

HTTP_REQUEST_ID: ContextVar[str | None] = ContextVar("http_request_id", default=None)


def _add_http_request_id(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    request_id = HTTP_REQUEST_ID.get()
    if request_id is not None:
        event.setdefault("http_request_id", request_id)
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


def configure_logging(level: str = "INFO") -> None:
    """Log JSON lines at ``level`` (``DEBUG``, ``INFO``, ``WARNING``...) on stderr: structlog's
    loggers and, through :func:`json_formatter`, the standard library's root logger."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[*_shared_processors(), structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    if not any(isinstance(handler, _JSONHandler) for handler in root.handlers):
        handler = _JSONHandler(sys.stderr)
        handler.setFormatter(json_formatter())
        root.addHandler(handler)
    root.setLevel(numeric)


class _JSONHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root logger's JSON handler (told apart so that configuring twice adds it once)."""
