"""``415 unsupported_media_type``: the one check that a request body says it is JSON.

Applied to every route by the app's ``before_request`` hook, after authentication and before the
body is read. It is a coroutine, so Litestar awaits it on the event loop instead of handing it to
its thread pool as it does a plain function, and not a guard, whose every call copies the route
handler: as a sync guard both showed up as ~15 % of the worker's samples in py-spy. A handler that
takes a JSON body (a ``data`` parameter, or ``opt={"json_body": True}`` for one that reads the raw
body itself, like the payment notification) accepts a non-empty body only with ``Content-Type:
application/json`` or ``application/<subtype>+json`` (parameters such as ``charset`` allowed). A
request without a body (a cancel, a refund without options) is not concerned.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection

from service.api.problems import Problem

JSON_BODY_OPT = "json_body"
"""``opt`` key marking a handler that reads a JSON body without a ``data`` parameter."""


def is_json_media_type(content_type: str) -> bool:
    """True for ``application/json`` and ``application/<subtype>+json``, with any parameters."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or (subtype.endswith("+json") and len(subtype) > 5))


def _has_body(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    headers = connection.headers
    if "transfer-encoding" in headers:
        return True
    length = headers.get("content-length", "0").strip()
    return length != "0" and length != ""


async def require_json_body(request: Request[Any, Any, Any]) -> None:
    """``before_request`` hook: 415 ``unsupported_media_type`` for a body that does not say JSON
    on a route that takes JSON (see the module). Returns None, so the handler runs."""
    route_handler = request.route_handler
    takes_json = route_handler.opt.get(JSON_BODY_OPT) or "data" in route_handler.parsed_fn_signature.parameters
    if not takes_json or not _has_body(request):
        return
    content_type = request.headers.get("content-type", "")
    if not is_json_media_type(content_type):
        raise Problem(
            415,
            "unsupported_media_type",
            f"The body must be JSON (Content-Type: application/json), not {content_type or 'unlabelled'!r}.",
        )
