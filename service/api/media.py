"""``415 unsupported_media_type``: the one check that a request body says it is JSON.

Called by the app's ``before_request`` hook (``service/api/hooks.py``), after authentication and
before the body is read. A handler that takes a JSON body (a ``data`` parameter, or
``opt={"json_body": True}`` for one that reads the raw body itself, like the payment notification)
accepts a non-empty body only with ``Content-Type: application/json`` or
``application/<subtype>+json`` (parameters such as ``charset`` allowed). A request without a body
(a cancel, a refund without options) is not concerned.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection

from service.api.problems import Problem

JSON_BODY_OPT = "json_body"
"""``opt`` key marking a handler that reads a JSON body without a ``data`` parameter."""


def is_json_media_type(content_type: str) -> bool:
    """True for ``application/json`` and ``application/<subtype>+json``, with any parameters."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or (subtype.endswith("+json") and len(subtype) > 5))


def has_body(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    """True when the request announces a body (``Transfer-Encoding`` or a non-zero ``Content-Length``)."""
    headers = connection.headers
    if "transfer-encoding" in headers:
        return True
    length = headers.get("content-length", "0").strip()
    return length != "0" and length != ""


def require_json_media_type(connection: ASGIConnection[Any, Any, Any, Any]) -> None:
    """Raises :class:`Problem` 415 ``unsupported_media_type`` when the body does not say JSON
    (call it only for a request that has a body, on a route that takes JSON)."""
    content_type = connection.headers.get("content-type", "")
    if not is_json_media_type(content_type):
        raise Problem(
            415,
            "unsupported_media_type",
            f"The body must be JSON (Content-Type: application/json), not {content_type or 'unlabelled'!r}.",
        )
