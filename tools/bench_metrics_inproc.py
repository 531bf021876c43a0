"""What metrics cost a request, in process: the product API built three times in one process,
metrics on, metrics off, and metrics on again (an A/A control), each called as ASGI by
``--concurrency`` callers on the product no-op and on the sold-out load, the three copies
alternated loop by loop (their order reversed every other loop). The figure is the process's
CPU time per request, best and median of ``--repeats`` loops of ``--requests`` requests: the
bench's paired rows (docs/BENCHMARKS.md, "Metrics on / off") without two servers sharing two
cores. Needs the services (an isolated run: its own database, key prefix and queues).

    .venv/bin/python tools/bench_metrics_inproc.py [--requests 3000] [--repeats 5] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys

import toolkit.bench.product_app as bench_app
from db.migrate import upgrade
from service.api.tokens import issue_token
from service.settings import Settings
from toolkit.bench.run import bench_settings
from toolkit.sale.isolation import new_run_id
from toolkit.sale.stores import tear_down
from tools.bench_accept_inproc import BUYERS, _call, _cpu_per_request

SOLD_OUT = 8
BODY = b'{"product_id": %d, "quantity": 1}' % SOLD_OUT
LOADS = {"product no-op": ("/api/v1/bench/noop", 202), "sold out": ("/api/v1/orders", 409)}


async def main(requests: int, repeats: int, concurrency: int) -> None:
    os.environ.setdefault("FLASHSALE_ENV", "development")
    settings = bench_settings(Settings(), new_run_id("metrics"))
    off = settings.model_copy(update={"metrics": settings.metrics.model_copy(update={"enabled": False})})
    await upgrade(settings.db.url)
    apps = {
        "on": bench_app.create_app(settings),
        "off": bench_app.create_app(off),
        "on again": bench_app.create_app(settings),
    }
    tokens = [issue_token(settings.auth.jwt_secret, f"buyer-{i}") for i in range(BUYERS)]
    admin = issue_token(settings.auth.jwt_secret, "admin", admin=True)
    product = {"stock": 0, "price": 100, "per_user_limit": 1, "name": "sold out", "stock_mode": "redis"}
    micros: dict[tuple[str, str], list[float]] = {}
    try:
        async with apps["on"].lifespan(), apps["off"].lifespan(), apps["on again"].lifespan():
            put = await _call(
                apps["on"], "PUT", f"/api/v1/admin/products/{SOLD_OUT}", admin, json.dumps(product).encode()
            )
            assert put == 200, f"creating the product: {put}"
            for loop in range(repeats):
                for load, (path, expect) in LOADS.items():
                    order = list(apps.items()) if loop % 2 == 0 else list(apps.items())[::-1]
                    for name, app in order:
                        call = {"body": BODY, "expect": expect}
                        await _cpu_per_request(app, path, tokens, min(300, requests), concurrency, **call)  # warm-up
                        used = await _cpu_per_request(app, path, tokens, requests, concurrency, **call)
                        micros.setdefault((load, name), []).append(used)
    finally:
        await tear_down(settings)
    out = sys.stdout
    for load in LOADS:
        best = {name: min(micros[load, name]) for name in apps}
        median = {name: sorted(micros[load, name])[repeats // 2] for name in apps}
        print(f"{load}: CPU us/request best {best}, median {median}", file=out)
        print(
            f"  requests per CPU-s, on / off: {best['off'] / best['on']:.3f} (best), {median['off'] / median['on']:.3f}"
            f" (median); on / on again: {best['on again'] / best['on']:.3f}, {median['on again'] / median['on']:.3f}",
            file=out,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    arguments = parser.parse_args()
    sys.stderr = io.TextIOWrapper(open(os.devnull, "wb"))  # the access log's lines, not the report
    asyncio.run(main(arguments.requests, arguments.repeats, arguments.concurrency))
