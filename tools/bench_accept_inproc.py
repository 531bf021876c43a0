"""What the accept path costs beside the product no-op, in process: the real app (its lifespan,
the real Redis, RabbitMQ and MariaDB, an isolated run), called as ASGI by ``--concurrency``
callers at once, no network and no granian, so only the worker's Python work counts. The figure
is the process's CPU time per request, best of ``--repeats`` loops (the load of other processes
barely moves it, unlike a rate).

It measures whatever code is first on the path: to compare two commits, check the other one out
in a worktree and run the script from it, alternately, e.g.

    git worktree add /tmp/before <rev>
    PYTHONPATH=/tmp/before .venv/bin/python tools/bench_accept_inproc.py
    .venv/bin/python tools/bench_accept_inproc.py

Run it with the machine otherwise idle (it is no test: nothing is asserted about time).

    .venv/bin/python tools/bench_accept_inproc.py [--requests 3000] [--repeats 2] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from typing import Any

from litestar import Litestar

import toolkit.bench.product_app as bench_app
from db.migrate import upgrade
from service.api.tokens import issue_token
from service.settings import Settings
from toolkit.bench.run import bench_settings
from toolkit.sale.isolation import new_run_id
from toolkit.sale.stores import tear_down
from tools.asgi_scope import json_scope

PRODUCT = 7
BUYERS = 1000
BODY = b'{"product_id": %d, "quantity": 1}' % PRODUCT


async def _call(app: Litestar, method: str, path: str, token: str, body: bytes) -> int:
    """One request through the ASGI app; its status."""
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(json_scope(method, path, body, token), receive, send)  # type: ignore[arg-type]
    return status


async def _cpu_per_request(
    app: Litestar,
    path: str,
    tokens: list[str],
    requests: int,
    concurrency: int,
    *,
    body: bytes = BODY,
    expect: int = 202,
) -> float:
    """CPU microseconds per request of ``requests`` POSTs of ``body`` to ``path`` by ``concurrency`` callers.

    Raises:
        AssertionError: a request was not answered ``expect``.
    """
    numbers = iter(range(requests))
    statuses: set[int] = set()

    async def caller() -> None:
        for n in numbers:
            statuses.add(await _call(app, "POST", path, tokens[n % len(tokens)], body))

    started = time.process_time()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    assert statuses == {expect}, f"unexpected statuses {statuses}"
    return (time.process_time() - started) / requests * 1e6


async def main(requests: int, repeats: int, concurrency: int) -> None:
    os.environ.setdefault("FLASHSALE_ENV", "development")
    settings = bench_settings(Settings(), new_run_id("inproc"))
    await upgrade(settings.db.url)
    app = bench_app.create_app(settings)  # the product API and the no-op route
    secret = settings.auth.jwt_secret
    buyers = [issue_token(secret, f"buyer-{i}") for i in range(BUYERS)]
    product = {"stock": 100_000_000, "price": 100, "per_user_limit": 1_000_000, "name": "inproc", "stock_mode": "redis"}
    try:
        async with app.lifespan():
            admin = issue_token(secret, "admin", admin=True)
            put = await _call(app, "PUT", f"/api/v1/admin/products/{PRODUCT}", admin, json.dumps(product).encode())
            assert put == 200, f"creating the product: {put}"
            best: dict[str, float] = {}
            for _ in range(repeats):
                for label, path in (("product no-op", "/api/v1/bench/noop"), ("accept", "/api/v1/orders")):
                    await _cpu_per_request(app, path, buyers, min(500, requests), concurrency)  # warm-up
                    micros = await _cpu_per_request(app, path, buyers, requests, concurrency)
                    best[label] = min(best.get(label, float("inf")), micros)
    finally:
        await tear_down(settings)
    out = sys.stdout
    print(f"{'row':16} {'CPU us/request':>14}", file=out)
    for label, micros in best.items():
        print(f"{label:16} {micros:14.1f}", file=out)
    print(f"accept / product no-op (requests per CPU second): {best['product no-op'] / best['accept']:.3f}", file=out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    arguments = parser.parse_args()
    sys.stderr = io.TextIOWrapper(open(os.devnull, "wb"))  # the access log's lines, not the report
    asyncio.run(main(arguments.requests, arguments.repeats, arguments.concurrency))
