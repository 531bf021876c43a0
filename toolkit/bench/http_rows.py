"""The HTTP rows: servers started once, products created, every row measured with wrk
(``--rounds`` times, interleaved, so a change in the machine's load hits every row alike)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx

from service.api.tokens import issue_token
from toolkit.bench import profile
from toolkit.bench.buyers import BUYERS, REQUESTS_PER_BUYER, buyers_reached, mint_tokens
from toolkit.bench.context import (
    ACCEPT,
    ACCEPT_LIMIT,
    ACCEPT_STOCK,
    DB_ACCEPT,
    DB_SOLD_OUT,
    DRAIN,
    PRICE,
    RAW_BATCH,
    RAW_ONE,
    RESERVE,
    SOLD_OUT,
    WARMUP_SECONDS,
    BenchError,
    Context,
    pipeline_product,
)
from toolkit.bench.procstat import CpuSample
from toolkit.bench.rows import HTTP_ROWS, PIPELINE_ROWS, SERVERS, HttpRow, Row, merge_rounds, round_groups
from toolkit.bench.server import PRODUCT_APP, Child, granian_argv
from toolkit.bench.wrk import run_wrk, write_script
from toolkit.sale.isolation import free_port

PATHS = {"bare_noop": "/noop", "noop": "/api/v1/bench/noop"}
"""Targets that are not purchases; every other target is ``POST /api/v1/orders`` of :data:`PRODUCTS`."""
PRODUCTS = {"sold_out": SOLD_OUT, "accept": ACCEPT, "db_sold_out": DB_SOLD_OUT, "db_accept": DB_ACCEPT}


def purchase_body(product: int) -> bytes:
    """The JSON body of a purchase of one unit of ``product``."""
    return json.dumps({"product_id": product, "quantity": 1}, separators=(",", ":")).encode()


def _target(row: HttpRow, port: int) -> tuple[str, bytes]:
    """URL and body of ``row``'s requests."""
    body = purchase_body(PRODUCTS.get(row.target, SOLD_OUT))
    return f"http://127.0.0.1:{port}{PATHS.get(row.target, '/api/v1/orders')}", body


async def start_server(
    ctx: Context, kind: str, name: str, env: dict[str, str], workers: int | None = None
) -> tuple[Child, int]:
    port = free_port()
    workers = workers or ctx.options.workers
    if kind == "bare":
        argv = granian_argv("toolkit.bench.bare_app:create_app", port, workers)
        child = Child(name, argv, {**os.environ}, ctx.log_dir)
        await child.wait_ready("POST", f"http://127.0.0.1:{port}/noop", 202, b'{"product_id":1,"quantity":1}')
    else:
        argv = granian_argv(PRODUCT_APP, port, workers, api=True)  # as flashsale serve, + no-op
        child = Child(name, argv, {**ctx.env, **env}, ctx.log_dir)
        await child.wait_ready("GET", f"http://127.0.0.1:{port}/api/v1/health/ready", 200)
    return child, port


async def create_products(ctx: Context, port: int) -> None:
    """Through the admin route: sold out (stock 0) and the accept product, in stock mode
    ``redis`` and again in ``database``, and per round one product per drain row with
    ``backlog`` units and a per-user limit as high, and the pipeline rows' products (stock as
    the accept product's)."""
    admin = issue_token(ctx.settings.auth.jwt_secret, "bench-admin", admin=True)
    stock = {
        SOLD_OUT: (0, 1, "redis"),
        ACCEPT: (ACCEPT_STOCK, ACCEPT_LIMIT, "redis"),
        DB_SOLD_OUT: (0, 1, "database"),
        DB_ACCEPT: (ACCEPT_STOCK, ACCEPT_LIMIT, "database"),
    }
    for r in range(ctx.options.rounds):
        for n in range(len(PIPELINE_ROWS)):
            for warmup in (False, True):
                stock[pipeline_product(r, n, warmup=warmup)] = (ACCEPT_STOCK, ACCEPT_LIMIT, "redis")
        for product in (DRAIN + r, RAW_ONE + r, RAW_BATCH + r, RESERVE + r):
            # the backlog's 1,000 buyers each order backlog/1,000 units: a limit that never bites,
            # so the consumer writes every order as the raw writers do (with a limit of 1 it wrote
            # 19 of 20 as rejected, limit_exceeded, giving each one's quota back)
            stock[product] = (ctx.options.backlog, ctx.options.backlog, "redis")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as client:
        for product, (units, limit, mode) in stock.items():
            body = {
                "stock": units,
                "price": PRICE,
                "per_user_limit": limit,
                "name": f"bench {product}",
                "stock_mode": mode,
            }
            answer = await client.put(
                f"/api/v1/admin/products/{product}", json=body, headers={"Authorization": f"Bearer {admin}"}
            )
            if answer.status_code != 200:
                raise BenchError(f"creating product {product}: {answer.status_code} {answer.text[:300]}")


async def _probe(row: HttpRow, url: str, body: bytes, token: str) -> None:
    """One request before the load: the answer must be ``row.expect`` (and ``sold_out`` for a 409)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        answer = await client.post(url, content=body, headers=headers)
    wrong_code = row.expect == 409 and answer.json().get("code") != "sold_out"
    if answer.status_code != row.expect or wrong_code:
        raise BenchError(f"{row.key}: a probe got {answer.status_code} {answer.text[:200]}, expected {row.expect}")


def buyers_script(ctx: Context, name: str, body: bytes) -> tuple[Path, str]:
    """wrk's script for one load of :data:`BUYERS` new buyers (``name`` makes their ids and the
    script's file unique in the run) and one of their tokens, for a probe. The script holds
    every token (a few MB): delete it once its wrk ran."""
    tokens = mint_tokens(ctx.settings.auth.jwt_secret, name, BUYERS)
    script = ctx.log_dir / f"{name}.lua"
    return write_script(script, body, tokens, REQUESTS_PER_BUYER, ctx.options.threads), tokens[0]


async def _measure(
    ctx: Context,
    row: HttpRow,
    child: Child,
    port: int,
    round_no: int,
    profiled: bool,
    together: asyncio.Barrier | None = None,
) -> Row:
    """One round of ``row``: a probe, a warm-up, then ``duration`` seconds measured (started at
    once with the other rows of ``together``, when given); the warm-up and the measured load each
    with buyers of their own."""
    opts = ctx.options
    url, body = _target(row, port)
    warmup, token = buyers_script(ctx, f"{row.key}-r{round_no}-w", body)
    await _probe(row, url, body, token)
    await asyncio.to_thread(run_wrk, url, warmup, WARMUP_SECONDS, opts.connections, opts.threads)
    warmup.unlink()
    script, _ = buyers_script(ctx, f"{row.key}-r{round_no}", body)
    if together is not None:
        await together.wait()
    groups = {"server": child.pids(), **ctx.stores}
    spy = None
    if profiled and opts.profile_dir is not None:
        spy = profile.start(child.process.pid, opts.profile_dir / f"{row.key}.txt", opts.duration)
    started, before = time.perf_counter(), CpuSample.take(groups)
    result = await asyncio.to_thread(run_wrk, url, script, opts.duration, opts.connections, opts.threads)
    script.unlink()
    wall = time.perf_counter() - started
    cpu = {"client": round(result.cpu / wall, 3), **before.shares(CpuSample.take(groups), wall)}
    if spy is not None and opts.profile_dir is not None:
        await asyncio.to_thread(spy.wait)
        ctx.profiles[row.key] = profile.summarize(opts.profile_dir / f"{row.key}.txt")
    s = result.summary
    seconds = s["duration_us"] / 1e6
    statuses = dict(sorted(s["statuses"].items()))
    ok = statuses.get(str(row.expect), 0)
    e = s["errors"]
    return Row(
        key=row.key,
        label=row.label,
        unit="req/s",
        rate=round(ok / seconds, 1),
        count=ok,
        seconds=round(seconds, 3),
        reference=row.reference,
        p50_ms=s["latency_us"]["p50"] / 1000,
        p99_ms=s["latency_us"]["p99"] / 1000,
        statuses=statuses,
        unexpected=sum(statuses.values()) - ok,
        socket_errors=e["connect"] + e["read"] + e["write"] + e["timeout"],
        cpu=cpu,
        buyers=buyers_reached(s["requests"], BUYERS),
    )


async def http_rows(ctx: Context, *, products: bool = True) -> list[Row]:
    """Start the servers of :data:`SERVERS` the measured rows of :data:`HTTP_ROWS` need (and the ``api``
    server always, with ``products``: it creates the products, the drain rows' too, so that no twin
    of a metrics pair has a history the other lacks), create the products on it, measure every row
    ``rounds`` times (round robin, :func:`round_order`), stop the servers."""
    rows = [row for row in HTTP_ROWS if ctx.options.wants(row.key)]
    needed = {row.server for row in rows}
    specs = [spec for spec in SERVERS if spec.name in needed]
    if products and not any(spec.name == "api" for spec in specs):
        specs.append(next(spec for spec in SERVERS if spec.name == "api"))
    servers: dict[str, tuple[Child, int]] = {}
    try:
        for spec in specs:
            ctx.console.print(f"starting {spec.name} ({spec.workers or ctx.options.workers} granian worker(s))")
            servers[spec.name] = await start_server(ctx, spec.kind, spec.name, spec.env, spec.workers)
        api = next((s.name for s in specs if s.name == "api"), None)
        if api is not None:
            await create_products(ctx, servers[api][1])
        measured: dict[str, list[Row]] = {row.key: [] for row in rows}
        for r in range(ctx.options.rounds):
            for group in round_groups(rows):
                # A pair's wrk runs start together; which one's task runs first alternates by round.
                group = group if r % 2 == 0 else group[::-1]
                labels = " + ".join(row.label for row in group)
                ctx.console.print(f"round {r + 1}/{ctx.options.rounds}: {labels}" + (" (at once)" if group[1:] else ""))
                together = asyncio.Barrier(len(group)) if group[1:] else None
                for row in group:
                    servers[row.server][0].check_alive()
                answers = await asyncio.gather(
                    *(_measure(ctx, row, *servers[row.server], r, profiled=r == 0, together=together) for row in group)
                )
                for row, answer in zip(group, answers, strict=True):
                    measured[row.key].append(answer)
    finally:
        for child, _ in servers.values():
            await child.stop()
    return [merge_rounds(rounds) for rounds in measured.values()]
