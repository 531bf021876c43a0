"""What each layer of the API costs the product no-op (the bench's target ``product no-op >= 0.75 x
bare no-op``, docs/BENCHMARKS.md), measured in process: the ASGI app called directly, no network
and no granian, so only the Python work per request counts.

Rows: the bare app (:mod:`toolkit.bench.bare_app`); the product no-op (``POST /api/v1/bench/noop``
of :mod:`toolkit.bench.product_app`: JWT auth, the ``before_request`` hook, request observation,
body decode); and the product no-op with one layer taken out each time (metrics and access log
off; the hook replaced by one that does nothing; no JWT middleware). Each row's figure is the best
of ``--repeats`` timed loops of ``--requests`` requests, in microseconds per request. The lifespan
does not run: the no-op touches no store, so nothing here needs Redis, MySQL or RabbitMQ.

    .venv/bin/python tools/bench_noop_layers.py [--requests 3000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from litestar import Litestar

import service.api.app as api_app
import toolkit.bench.product_app as bench_app
from service.api.tokens import issue_token
from service.settings import Settings
from toolkit.bench.bare_app import create_app as create_bare_app
from toolkit.sale.isolation import with_own_secrets
from tools.asgi_scope import json_scope

BODY = b'{"product_id": 1, "quantity": 1}'


async def _microseconds(app: Litestar, path: str, token: str | None, requests: int, repeats: int) -> float:
    """Best of ``repeats`` loops: microseconds per request. Raises AssertionError on any status but 202."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    statuses: set[int] = set()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    for _ in range(200):  # warm-up: caches (verified tokens, body specs, routes) filled
        await app(json_scope("POST", path, BODY, token), receive, send)  # type: ignore[arg-type]
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(requests):
            await app(json_scope("POST", path, BODY, token), receive, send)  # type: ignore[arg-type]
        best = min(best, (time.perf_counter() - started) / requests * 1e6)
    assert statuses == {202}, f"unexpected statuses {statuses}"
    return best


@contextmanager
def _replaced(name: str, value: object) -> Iterator[None]:
    """``service.api.app.<name>`` replaced while the app is built."""
    saved = getattr(api_app, name)
    setattr(api_app, name, value)
    try:
        yield
    finally:
        setattr(api_app, name, saved)


class _NoJWT:
    """Stands in for the JWT auth config: adds no middleware."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def on_app_init(self, app_config: Any) -> Any:
        return app_config


async def _no_hook(request: object) -> None:
    return None


async def main(requests: int, repeats: int) -> None:
    os.environ.setdefault("FLASHSALE_ENV", "development")
    settings = with_own_secrets(Settings())
    quiet = settings.model_copy(
        update={"metrics": settings.metrics.model_copy(update={"enabled": False}), "access_log": False}
    )
    token = issue_token(settings.auth.jwt_secret, "bench-user")
    out = sys.stdout

    def build(name: str, value: object) -> Litestar:
        with _replaced(name, value):
            return bench_app.create_app(settings)

    noop = "/api/v1/bench/noop"
    rows: list[tuple[str, Callable[[], Litestar], str, str | None]] = [
        ("bare app", create_bare_app, "/noop", None),
        ("product no-op", lambda: bench_app.create_app(settings), noop, token),
        ("  without metrics and access log", lambda: bench_app.create_app(quiet), noop, token),
        ("  without the before_request hook", lambda: build("before_request", _no_hook), noop, token),
        ("  without JWT auth", lambda: build("make_jwt_auth", _NoJWT), noop, None),
    ]
    measured: dict[str, float] = {}
    for label, make, path, bearer in rows:
        measured[label] = await _microseconds(make(), path, bearer, requests, repeats)
    bare, product = measured["bare app"], measured["product no-op"]
    print(f"{'row':36} {'us/request':>10} {'layer costs':>11}", file=out)
    for label, micros in measured.items():
        layer = "" if not label.startswith("  ") else f"{product - micros:9.1f}"
        print(f"{label:36} {micros:10.1f} {layer:>11}", file=out)
    print(f"product no-op / bare (requests per CPU second): {bare / product:.2f}", file=out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    sys.stderr = io.TextIOWrapper(open(os.devnull, "wb"))  # the access log's lines, not the report
    asyncio.run(main(arguments.requests, arguments.repeats))
