"""``415 unsupported_media_type``: the one check that a request body says it is JSON.

Called by the app's ``before_request`` hook (``service/api/hooks.py``), after authentication and
before the body is read. A handler that takes a JSON body (a ``data`` parameter, or
``opt={"json_body": True}`` for one that reads the raw body itself, like the payment notification)
accepts a non-empty body only with ``Content-Type: application/json`` or
``application/<subtype>+json`` (parameters such as ``charset`` allowed). A request without a body
(a cancel, a refund without options) is not concerned.
"""

from __future__ import annotations

from litestar.types import Scope

from service.api.problems import Problem

JSON_BODY_OPT = "json_body"
"""``opt`` key marking a handler that reads a JSON body without a ``data`` parameter."""


def is_json_media_type(content_type: str) -> bool:
    """True for ``application/json`` and ``application/<subtype>+json``, with any parameters."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or (subtype.endswith("+json") and len(subtype) > 5))


def json_body_sent(scope: Scope) -> bool:
    """Whether the request announces a body (``Transfer-Encoding`` or a non-zero
    ``Content-Length``), read from the raw headers in one pass (Litestar's ``connection.headers``
    decodes every header into a new mapping first).

    Raises:
        Problem: 415 ``unsupported_media_type`` when it announces one whose ``Content-Type`` does
            not say JSON (call it only on a route that takes JSON).
    """
    length: bytes | None = None
    content_type: bytes | None = None
    chunked = False
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value if length is None else length
        elif name == b"content-type":
            content_type = value if content_type is None else content_type
        elif name == b"transfer-encoding":
            chunked = True
    if not chunked and (length is None or length.strip() in (b"0", b"")):
        return False
    text = (content_type or b"").decode("latin-1")
    if not is_json_media_type(text):
        raise Problem(
            415,
            "unsupported_media_type",
            f"The body must be JSON (Content-Type: application/json), not {text or 'unlabelled'!r}.",
        )
    return True
