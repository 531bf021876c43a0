"""What metrics and access logs cost the purchase path, side by side in one run.

Starts one API server (``flashsale serve``, 1 granian worker by default) per variant on an
isolated database, key prefix and queues, creates a sold-out product, then measures the product's
no-op route and the sold-out path on every variant with wrk, in interleaved rounds (a change in
the machine's load hits every variant alike), and prints req/s per variant and the ratio to the
variant with everything off. Removes what it created.

    .venv/bin/python scripts/bench_observability.py [--duration 3] [--rounds 3] [--connections 64]

Variants: ``all on`` (the defaults: metrics and access log), ``metrics only``
(``FLASHSALE_ACCESS_LOG=false``), ``all off`` (``FLASHSALE_METRICS__ENABLED=false`` too).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path

from service.api.auth import issue_token
from service.bench.procstat import cpu_seconds
from service.bench.server import Child, flashsale_argv
from service.bench.wrk import run_wrk, write_script
from service.sale.isolation import environment, free_port, isolated_settings, new_run_id
from service.sale.stores import tear_down
from service.settings import Settings

VARIANTS = {
    "all on": {},
    "metrics only": {"FLASHSALE_ACCESS_LOG": "false"},
    "all off": {"FLASHSALE_ACCESS_LOG": "false", "FLASHSALE_METRICS__ENABLED": "false"},
}
ROWS = {"no-op": "/api/v1/bench/noop", "sold out": "/api/v1/orders"}
SOLD_OUT = 1
BODY = b'{"product_id":1,"quantity":1}'


async def _asgi_app(scope: dict, receive: object, send) -> None:  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 202, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def middleware_cost(requests: int = 100_000, rounds: int = 5) -> None:
    """The request middleware alone (service.api.observe.ObserveRequests) around an ASGI app that
    answers at once, in this process: microseconds it adds per request (min of ``rounds``),
    steady where wrk's req/s are not (a loaded machine)."""
    import io
    import time

    from service import metrics
    from service.api.observe import AccessLog, ObserveRequests

    class Discard(io.RawIOBase):
        def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
            return len(data)

    async def send(_: object) -> None:
        pass

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    headers = [(b"host", b"x"), (b"authorization", b"Bearer x"), (b"content-type", b"application/json")]
    variants = {
        "bare app": _asgi_app,
        "request id": ObserveRequests(_asgi_app, observe=False, access_log=None),
        "+ metrics": ObserveRequests(_asgi_app, observe=True, access_log=None),
        "+ access log": ObserveRequests(_asgi_app, observe=True, access_log=AccessLog(Discard())),  # type: ignore[arg-type]
    }
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, app in variants.items():
            started = time.perf_counter()
            for _ in range(requests):
                scope = {"type": "http", "method": "POST", "path": "/api/v1/orders", "headers": headers, "state": {}}
                scope["path_template"] = "/api/v1/orders"
                await app(scope, receive, send)
            best[name] = min(best[name], (time.perf_counter() - started) / requests * 1e6)
            metrics.flush()
    print("middleware alone, in process (us per request, min of rounds):")
    for name, cost in best.items():
        print(f"  {name:14} {cost:6.2f} us  (+{cost - best['bare app']:5.2f} over the bare app)")


async def main(duration: int, rounds: int, connections: int, workers: int) -> None:
    from db.migrate import upgrade

    await middleware_cost()
    settings: Settings = isolated_settings(Settings(), new_run_id("obs")).model_copy(update={"bench_routes": True})
    await upgrade(settings.db.url)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-observability-"))
    servers: dict[str, tuple[Child, int]] = {}
    try:
        for name, extra in VARIANTS.items():
            port = free_port()
            argv = flashsale_argv("serve", "--port", str(port), "--workers", str(workers))
            # the access log goes to the log file, as it would to a collector
            child = Child(name.replace(" ", "-"), argv, {**os.environ, **environment(settings), **extra}, log_dir)
            await child.wait_ready("GET", f"http://127.0.0.1:{port}/api/v1/health/ready", 200)
            servers[name] = (child, port)
        import httpx

        admin = issue_token(settings.auth.jwt_secret, "bench-admin", admin=True)
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            answer = await client.put(
                f"http://127.0.0.1:{servers['all on'][1]}/api/v1/admin/products/{SOLD_OUT}",
                json={"stock": 0, "price": 100, "per_user_limit": 1},
                headers={"Authorization": f"Bearer {admin}"},
            )
            answer.raise_for_status()
        script = write_script(log_dir / "load.lua", BODY, [issue_token(settings.auth.jwt_secret, "buyer", admin=False)])
        rates: dict[tuple[str, str], list[float]] = {}
        costs: dict[tuple[str, str], list[float]] = {}
        for r in range(rounds):
            for row, path in ROWS.items():
                for name, (child, port) in servers.items():
                    url = f"http://127.0.0.1:{port}{path}"
                    await asyncio.to_thread(run_wrk, url, script, 1, connections, 1)  # warm-up
                    pids = child.pids()
                    before = cpu_seconds(pids)
                    result = await asyncio.to_thread(run_wrk, url, script, duration, connections, 1)
                    used = cpu_seconds(pids) - before
                    s = result.summary
                    expected = "202" if row == "no-op" else "409"
                    answered = s["statuses"].get(expected, 0)
                    rate = answered / (s["duration_us"] / 1e6)
                    rates.setdefault((row, name), []).append(rate)
                    costs.setdefault((row, name), []).append(used / answered * 1e6)
                    print(
                        f"round {r + 1} {row:8} {name:12} {rate:9.0f} req/s {used / answered * 1e6:7.1f} us CPU/req",
                        flush=True,
                    )
        print(f"\nmedian of {rounds} rounds, {duration}s each, {connections} connections, {workers} worker(s):")
        for row in ROWS:
            base = statistics.median(rates[row, "all off"])
            base_cost = statistics.median(costs[row, "all off"])
            for name in VARIANTS:
                rate = statistics.median(rates[row, name])
                cost = statistics.median(costs[row, name])
                print(
                    f"{row:8} {name:12} {rate:9.0f} req/s ({rate / base:5.3f} of all off)"
                    f"  {cost:6.1f} us server CPU/req ({cost / base_cost - 1:+6.1%})"
                )
    finally:
        for child, _ in servers.values():
            await child.stop()
        await tear_down(settings)
        print(f"server logs: {log_dir}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.duration, args.rounds, args.connections, args.workers))
