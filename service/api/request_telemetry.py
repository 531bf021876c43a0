"""What every HTTP request leaves behind for the operator: a request id, one latency
observation by method, route template and status (:mod:`service.metrics`), one access-log line;
and the ``GET /metrics`` route.

:class:`RequestTelemetry` works in Litestar's hooks, not as a middleware around ``send``: any
route middleware makes Litestar wrap every route in a second exception-handling layer, and a
wrapper around ``send`` runs on every ASGI message (docs/BENCHMARKS.md, "What the profile
showed"). :meth:`RequestTelemetry.begin` runs first in the app's ``before_request`` hook
(:mod:`service.api.hooks`); the answer is observed by the app's ``after_request`` hook when the
handler (or the hook) answered, and by the exception handler that answered otherwise
(:meth:`RequestTelemetry.observing`), both in the request's task: the request in flight is a
context variable between them. A request a guard refused before the hook ran is observed by
its exception handler alone (its duration from there); one that matched no route (``404``,
``405``) is not observed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextvars import ContextVar
from time import perf_counter
from typing import Any, BinaryIO, cast

import msgspec
from litestar import Request, Response, get
from litestar.config.app import AppConfig
from litestar.handlers import HTTPRouteHandler
from litestar.types import HTTPScope, Scope

from service import metrics
from service.api.controllers.ops import OpsController
from service.api.controllers.ops_rooms import OpsRoomsController
from service.log_setup import HTTP_REQUEST_ID
from service.settings import Settings

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
_ORDER = "flashsale.order"  # key in the request's scope["state"]
_encode = msgspec.json.Encoder().encode
_ACCESS_LOG_BATCH = 256  # lines held at most before a write
ACCESS_LOG_FLUSH_SECONDS = 0.2


class AccessLog:
    """Access-log lines (JSON, the fields structlog's lines have), written to ``stream`` in
    batches by :meth:`flush` (the lifespan calls it every :data:`ACCESS_LOG_FLUSH_SECONDS`), so
    a request pays for one small encode and no write."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lines: list[bytes] = []
        self._second = -1
        self._second_text = ""

    def timestamp(self) -> str:
        """Now, UTC, ISO 8601 with microseconds and ``Z`` (as structlog's lines); the date and
        time of day are formatted once a second."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second, self._second_text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((now - second) * 1_000_000):06d}Z"

    def add(self, line: dict[str, object]) -> None:
        self._lines.append(_encode(line) + b"\n")
        if len(self._lines) >= _ACCESS_LOG_BATCH:
            self.flush()

    def flush(self) -> None:
        if self._lines:
            lines, self._lines = self._lines, []
            self._stream.write(b"".join(lines))
            self._stream.flush()


class _Exchange:
    """One request in flight: its scope, when the hook began it, its request id."""

    __slots__ = ("scope", "started", "request_id")

    def __init__(self, scope: HTTPScope, started: float, request_id: str) -> None:
        self.scope, self.started, self.request_id = scope, started, request_id


_IN_FLIGHT: ContextVar[_Exchange | None] = ContextVar("flashsale_http_exchange", default=None)
ExceptionHandler = Callable[[Request[Any, Any, Any], Any], Response[Any]]


class RequestTelemetry:
    """Per HTTP request: the request id (an incoming ``X-Request-ID`` of 1-128 visible ASCII
    characters, else a minted one: a random 16-hex prefix of the process and a hex counter) set
    in :data:`service.log_setup.HTTP_REQUEST_ID` and returned as ``X-Request-ID``; with metrics
    one observation of the duration in ``flashsale_http_request_duration_seconds{method, route,
    status}``; with an access log one line (method, path, route, status, duration in ms, the
    request id, and for a purchase its order's request id and order number). The duration runs
    from the ``before_request`` hook to the response built (routing and sending aside)."""

    def __init__(self, *, observe: bool, access_log: AccessLog | None) -> None:
        self._observe = observe
        self._access_log = access_log
        self._children: dict[tuple[str, str, int], metrics.LocalHistogram] = {}
        self._prefix = secrets.token_hex(8)
        self._minted = itertools.count()

    def begin(self, scope: HTTPScope) -> _Exchange:
        """The request ``scope`` starts: its id is set for every log line of the request's task
        (not reset afterwards: a task the request spawned, the async publisher, keeps the id it
        was spawned with)."""
        request_id = _incoming_request_id(scope["headers"]) or "%s%x" % (self._prefix, next(self._minted))  # noqa: UP031 - the cheapest
        HTTP_REQUEST_ID.set(request_id)
        exchange = _Exchange(scope, perf_counter(), request_id)
        _IN_FLIGHT.set(exchange)
        return exchange

    async def after_request(self, response: Response[Any]) -> Response[Any]:
        """The app's ``after_request`` hook: the handler's (or the ``before_request`` hook's)
        answer. A coroutine, so Litestar awaits it on the event loop (a plain function would go
        to its thread pool)."""
        exchange = _IN_FLIGHT.get()
        if exchange is not None:
            _IN_FLIGHT.set(None)
            status = response.status_code or cast(HTTPRouteHandler, exchange.scope["route_handler"]).status_code
            self._answered(exchange, response, status)
        return response

    def observing(self, handler: ExceptionHandler) -> ExceptionHandler:
        """``handler`` (an exception handler of the app), observing the answer it gives."""

        def observed(request: Request[Any, Any, Any], exc: Any) -> Response[Any]:
            response = handler(request, exc)
            scope = request.scope
            exchange = _IN_FLIGHT.get()
            if exchange is None or exchange.scope is not scope:
                if not scope.get("path_template"):  # no route matched
                    return response
                exchange = self.begin(scope)  # a guard refused it before the hook ran
            _IN_FLIGHT.set(None)
            self._answered(exchange, response, response.status_code or 500)
            return response

        return observed

    def _child(self, key: tuple[str, str, int]) -> metrics.LocalHistogram:
        method, route, status = key
        child = metrics.local_histogram(
            metrics.HTTP_REQUEST_SECONDS, method if method in _METHODS else "other", route, str(status)
        )
        self._children[key] = child
        return child

    def _answered(self, exchange: _Exchange, response: Response[Any], status: int) -> None:
        seconds = perf_counter() - exchange.started
        response.headers["X-Request-ID"] = exchange.request_id
        scope = exchange.scope
        route = scope.get("path_template", "")
        if self._observe:
            key = (scope["method"], route, status)
            (self._children.get(key) or self._child(key)).observe(seconds)
        if self._access_log is not None:
            line: dict[str, object] = {
                "event": "http_request",
                "level": "info",
                "timestamp": self._access_log.timestamp(),
                "method": scope["method"],
                "path": scope["path"],
                "route": route,
                "status": status,
                "duration_ms": round(seconds * 1000, 3),
                "http_request_id": exchange.request_id,
            }
            state = scope.get("state")
            if state and (order := state.get(_ORDER)) is not None:
                line["request_id"], line["order_no"] = order
            self._access_log.add(line)


def note_order(scope: Scope, request_id: str, order_no: str) -> None:
    """The purchase answering ``scope`` took (or replayed) this order: its request id and order
    number go in the access-log line, so one grep finds the HTTP request, the consumer's and the
    realignment's lines of an order."""
    scope.setdefault("state", {})[_ORDER] = (request_id, order_no)


def _incoming_request_id(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"x-request-id":
            return value.decode("ascii") if _REQUEST_ID.fullmatch(value) else None
    return None


@get("/metrics", exclude_from_auth=True, include_in_schema=False)
async def metrics_route() -> Response[bytes]:
    """Prometheus text format: every worker's values (multiprocess mode) or this process's."""
    metrics.flush()  # on the event loop: the local sums are the loop's
    body = await asyncio.to_thread(metrics.exposition)
    return Response(body, media_type=metrics.CONTENT_TYPE)


def install(app_config: AppConfig, settings: Settings) -> RequestTelemetry:
    """The request telemetry (request ids always; metrics with ``settings.metrics.enabled``,
    then also ``GET /metrics``; the access log with ``settings.access_log``) as the app's
    ``after_request`` hook and around every exception handler registered so far (call it after
    the last), and the lifespan that flushes the local metric sums and the access log. Returns
    the telemetry, whose :meth:`RequestTelemetry.begin` the ``before_request`` hook calls."""
    enabled = settings.metrics.enabled
    access_log = AccessLog(sys.stderr.buffer) if settings.access_log else None
    telemetry = RequestTelemetry(observe=enabled, access_log=access_log)
    app_config.after_request = telemetry.after_request
    handlers = app_config.exception_handlers
    for key, handler in list(handlers.items()):
        handlers[key] = telemetry.observing(handler)
    if enabled:
        app_config.route_handlers.append(metrics_route)
    app_config.route_handlers.append(OpsController)
    app_config.route_handlers.append(OpsRoomsController)

    @contextlib.asynccontextmanager
    async def flushing(_: Any) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if enabled:
                await stack.enter_async_context(metrics.flushing())
            if access_log is not None:
                await stack.enter_async_context(metrics.every(ACCESS_LOG_FLUSH_SECONDS, access_log.flush))
            yield
        if enabled:
            metrics.process_exited(os.getpid())

    app_config.lifespan.append(flushing)
    return telemetry
