"""The app's one ``before_request`` hook: the request's telemetry begins, OPTIONS answers,
authentication, 415 for non-JSON bodies, strict bodies.

A coroutine, so Litestar awaits it on the event loop instead of handing it to its thread pool as
it does a plain function. Not guards, whose every call copies the route handler (as a sync guard
the 415 check showed up as ~15 % of the worker's samples in py-spy), and not middleware, which
makes Litestar wrap every route in a second exception-handling layer (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request, Response

from service.api.auth import Authenticator, requires_token
from service.api.body import body_spec, check_json_body
from service.api.media import JSON_BODY_OPT, json_body_sent
from service.api.request_telemetry import RequestTelemetry

BeforeRequest = Callable[[Request[Any, Any, Any]], Awaitable[Response[None] | None]]


def _allow(request: Request[Any, Any, Any]) -> str:
    """The methods of the request's path (RFC 9110 section 10.2.1). Litestar's own OPTIONS handler
    lists only the methods of the first handler registered on a path (``OPTIONS /orders`` said
    ``OPTIONS, POST``), so the app's routes answer instead (a scan: OPTIONS is rare)."""
    template = request.scope.get("path_template")
    methods = {"OPTIONS"}
    for route in request.app.routes:
        if route.path_format == template:
            methods.update(route.methods)
    return ", ".join(sorted(methods))


def make_before_request(telemetry: RequestTelemetry, authenticator: Authenticator) -> BeforeRequest:
    """The hook: ``OPTIONS`` is answered 204 with ``Allow``. Otherwise a request to a route that
    needs a token (:func:`service.api.auth.requires_token`) is authenticated, unless a guard did;
    then, on a route that takes JSON: 415 for a body that does not say JSON
    (``service/api/media.py``), 400 for an empty required body or one that does not strictly match
    the handler's type (``service/api/body.py``). None lets the handler run."""
    needs_token: dict[tuple[str, str], bool] = {}  # (method, route template): one entry per route

    async def before_request(request: Request[Any, Any, Any]) -> Response[None] | None:
        scope = request.scope
        telemetry.begin(scope)
        method = scope["method"]
        if method == "OPTIONS":
            return Response(None, status_code=204, headers={"Allow": _allow(request)})
        route_handler = request.route_handler
        key = (method, scope["path_template"])
        needed = needs_token.get(key)
        if needed is None:
            needed = needs_token[key] = requires_token(route_handler, key[1])
        if needed and scope.get("user") is None:
            authenticator.authenticate(scope)
        spec = body_spec(route_handler)
        if spec is None and not route_handler.opt.get(JSON_BODY_OPT):
            return None
        body_sent = json_body_sent(scope)
        if spec is not None:
            await check_json_body(request, spec, body_sent)
        return None

    return before_request
