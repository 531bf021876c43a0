"""What each layer of the API costs the product no-op (the bench's target ``product no-op >= 0.65 x
bare no-op``, docs/BENCHMARKS.md), measured in process: the ASGI app called directly, no network
and no granian, so only the Python work per request counts.

Rows: the bare app (:mod:`toolkit.bench.bare_app`); the product no-op (``POST /api/v1/bench/noop``
of :mod:`toolkit.bench.product_app`: the ``before_request`` hook with authentication, request
telemetry, body decode); and the product no-op with one layer taken out each time (metrics and
access log off; authentication replaced by a fixed user; telemetry replaced by nothing). Each
row's figure is the best of ``--repeats`` timed loops of ``--requests`` requests, in CPU
microseconds per request (the process's CPU time, which other jobs on a shared machine disturb
less than the wall clock). The load is the bench's many buyers: each token sent 3 times in a row, so a third of
the requests bring a token the app has not seen (``--buyers 0``: one token for every request,
every one a cache hit). The lifespan does not run: the no-op touches no store, so nothing here
needs Redis, MySQL or RabbitMQ.

    .venv/bin/python tools/bench_noop_layers.py [--requests 3000] [--repeats 5] [--buyers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from litestar import Litestar

import service.api.app as api_app
import toolkit.bench.product_app as bench_app
from service.api.auth import User
from service.settings import Settings
from toolkit.bench.bare_app import create_app as create_bare_app
from toolkit.bench.buyers import mint_tokens
from toolkit.sale.isolation import with_own_secrets
from tools.asgi_scope import json_scope

BODY = b'{"product_id": 1, "quantity": 1}'
SENDS_PER_TOKEN = 3


async def _microseconds(
    app: Litestar, path: str, tokens: Callable[[], str | None], requests: int, repeats: int
) -> float:
    """Best of ``repeats`` loops: microseconds per request. Raises AssertionError on any status but 202."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    statuses: set[int] = set()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    for _ in range(200):  # warm-up: caches (body specs, routes) filled
        await app(json_scope("POST", path, BODY, tokens()), receive, send)  # type: ignore[arg-type]
    scopes = [[json_scope("POST", path, BODY, tokens()) for _ in range(requests)] for _ in range(repeats)]
    gc.collect()
    gc.freeze()  # as the server does after start-up (service/runtime.py): the rows' set-up is not traversed
    best = float("inf")
    for loop in scopes:
        started = time.process_time()
        for scope in loop:
            await app(scope, receive, send)  # type: ignore[arg-type]
        best = min(best, (time.process_time() - started) / requests * 1e6)
    assert statuses == {202}, f"unexpected statuses {statuses}"
    return best


@contextmanager
def _replaced(owner: Any, name: str, value: object) -> Iterator[None]:
    """``owner.<name>`` replaced while the app is built."""
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


class _FixedUser:
    """Stands in for the authenticator: every request is one buyer's, nothing verified."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._user = User("bench-user", is_admin=False)

    def authenticate(self, scope: dict[str, Any]) -> User:
        scope["user"] = self._user
        return self._user


class _NoTelemetry:
    """Stands in for the request telemetry: no request id, no observation, no access log."""

    def begin(self, scope: object) -> None:
        return None


def _buyers(secret: str, buyers: int) -> Callable[[], str]:
    """Each call the next request's token: ``buyers`` == 0 one token always, else new buyers' tokens
    (minted ahead, plenty for every row), each sent :data:`SENDS_PER_TOKEN` times in a row."""
    pool = mint_tokens(secret, "layers", 1 if buyers == 0 else 40_000)
    sends = (
        itertools.cycle(pool)
        if buyers == 0
        else itertools.chain.from_iterable(itertools.repeat(token, SENDS_PER_TOKEN) for token in itertools.cycle(pool))
    )
    return sends.__next__


async def main(requests: int, repeats: int, buyers: int) -> None:
    os.environ.setdefault("FLASHSALE_ENV", "development")
    settings = with_own_secrets(Settings())
    quiet = settings.model_copy(
        update={"metrics": settings.metrics.model_copy(update={"enabled": False}), "access_log": False}
    )
    tokens = _buyers(settings.auth.jwt_secret, buyers)
    out = sys.stdout

    def build(owner: Any, name: str, value: object) -> Litestar:
        with _replaced(owner, name, value):
            return bench_app.create_app(settings)

    def untelemetered() -> Litestar:
        with _replaced(api_app.request_telemetry, "install", lambda *_: _NoTelemetry()):
            app = bench_app.create_app(settings)
        app.after_request = None  # the handler resolves its hooks at its first request
        return app

    noop = "/api/v1/bench/noop"
    rows: list[tuple[str, Callable[[], Litestar], str, Callable[[], str | None]]] = [
        ("bare app", create_bare_app, "/noop", lambda: None),
        ("product no-op", lambda: bench_app.create_app(settings), noop, tokens),
        ("  without metrics and access log", lambda: bench_app.create_app(quiet), noop, tokens),
        ("  without authentication", lambda: build(api_app, "Authenticator", _FixedUser), noop, lambda: None),
        ("  without request telemetry", untelemetered, noop, tokens),
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
    parser.add_argument("--buyers", type=int, default=1, help="0: one token for every request")
    arguments = parser.parse_args()
    sys.stderr = io.TextIOWrapper(open(os.devnull, "wb"))  # the access log's lines, not the report
    asyncio.run(main(arguments.requests, arguments.repeats, arguments.buyers))
