"""The app's one ``before_request`` hook: OPTIONS answers, 415 for non-JSON bodies, strict bodies.

A coroutine, so Litestar awaits it on the event loop instead of handing it to its thread pool as
it does a plain function, and not a guard, whose every call copies the route handler: as a sync
guard the 415 check showed up as ~15 % of the worker's samples in py-spy.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response

from service.api.body import body_spec, check_json_body
from service.api.media import JSON_BODY_OPT, has_body, require_json_media_type


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


async def before_request(request: Request[Any, Any, Any]) -> Response[None] | None:
    """``OPTIONS``: 204 with ``Allow``. Otherwise, on a route that takes JSON: 415 for a body that
    does not say JSON (``service/api/media.py``), 400 for an empty required body or one that does
    not strictly match the handler's type (``service/api/body.py``). None lets the handler run."""
    if request.method == "OPTIONS":
        return Response(None, status_code=204, headers={"Allow": _allow(request)})
    route_handler = request.route_handler
    spec = body_spec(route_handler)
    if spec is None and not route_handler.opt.get(JSON_BODY_OPT):
        return None
    body_sent = has_body(request)
    if body_sent:
        require_json_media_type(request)
    if spec is not None:
        await check_json_body(request, spec, body_sent)
    return None
