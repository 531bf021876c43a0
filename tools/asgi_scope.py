"""An HTTP request as an ASGI scope, for the in-process benchmarks (``bench_accept_inproc.py``,
``bench_noop_layers.py``) that call the app directly, without a server."""

from __future__ import annotations

from typing import Any


def json_scope(method: str, path: str, body: bytes, token: str | None) -> dict[str, Any]:
    """The ASGI 3.0 HTTP scope of a ``method`` request to ``path`` with a JSON ``body`` (its
    length announced) and, when ``token`` is given, ``Authorization: Bearer <token>``."""
    headers = [(b"host", b"api"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if token is not None:
        headers.append((b"authorization", b"Bearer " + token.encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
