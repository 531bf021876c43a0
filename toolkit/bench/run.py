"""``flashsale bench``: run every row of :mod:`toolkit.bench.rows` in one isolated run.

Isolation as in ``flashsale sale``: database, Redis key prefix and queue names ``bench_<hex>``
and a random JWT secret (:mod:`toolkit.sale.isolation`); everything is removed at the end.
Servers are subprocesses on granian with the same options and ``--workers``; wrk drives them
(a 1 s warm-up, then ``--duration`` seconds measured; :mod:`toolkit.bench.http_rows`). Then a
backlog of ``--backlog`` orders is drained by ``--consumers`` ``flashsale consume`` processes and the same number
written by the raw writers (:mod:`toolkit.bench.drain`); last, the pipeline rows, HTTP to MySQL
with the consumers running (:mod:`toolkit.bench.pipeline`), and the floor beside them (the hops
alone, :func:`toolkit.bench.rows.floor_row`). With ``--rounds N`` every row is
measured N times, the rounds interleaved. ``--only KEY,...`` measures the named rows alone (the
drain rows run together when any of them is named).

Exit status: 0 when every row was measured (targets are reported, not enforced), 2 when
something could not be set up or run (wrk missing, a service down, a server failing).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

from redis.asyncio import Redis
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from db.migrate import upgrade
from service.settings import Settings
from toolkit.bench import profile
from toolkit.bench.context import BenchError, Context, Options
from toolkit.bench.drain import drain_rows
from toolkit.bench.http_rows import http_rows
from toolkit.bench.pipeline import pipeline_rows
from toolkit.bench.procstat import machine_info, store_pids
from toolkit.bench.report import Report, render
from toolkit.bench.rows import DRAIN_ROWS, PIPELINE_ROWS, accept_ceiling, fill_ratios, floor_row, judge
from toolkit.bench.server import ServerFailed
from toolkit.bench.wrk import WrkMissing, require_wrk
from toolkit.sale.isolation import environment, isolated_settings, new_run_id, with_own_secrets
from toolkit.sale.stores import tear_down


def bench_settings(base: Settings, run_id: str) -> Settings:
    """``base`` isolated under ``run_id`` with secrets of its own, no
    purchase rate limits (wrk sends every request from one address, each buyer's token a few
    times in a row: the limits would measure themselves) and no self-healing pass in the servers
    (``realign.auto_seconds`` 0). No consumer runs during the HTTP rows, so the accept rows'
    reservations stay unresolved: every pass over that growing journal (and, after the grace
    period, its republishing) would land in whichever row runs next on the ``api`` server, and
    only there (its metrics-off twin never sells). The pass is not a hop; its cost over a large
    journal is measured by ``tools/bench_realign_journal.py`` (docs/BENCHMARKS.md)."""
    isolated = with_own_secrets(isolated_settings(base, run_id))
    limits = isolated.rate_limit.model_copy(update={"user_per_second": 0.0, "address_per_second": 0.0})
    realign = isolated.realign.model_copy(update={"auto_seconds": 0.0})
    return isolated.model_copy(update={"rate_limit": limits, "realign": realign})


async def _versions(settings: Settings, engine: AsyncEngine) -> dict[str, str]:
    """Versions of the framework, the server, the load client and the stores (best effort)."""
    versions = {name: importlib.metadata.version(name) for name in ("litestar", "granian", "msgspec")}
    argv = [require_wrk(), "-v"]
    wrk = (await asyncio.to_thread(subprocess.run, argv, check=False, capture_output=True, text=True)).stdout.split()
    versions["wrk"] = wrk[1] if len(wrk) > 1 else "?"
    with contextlib.suppress(Exception):
        async with engine.connect() as conn:
            versions["mysql"] = (await conn.execute(text("SELECT VERSION()"))).scalar_one()
    with contextlib.suppress(Exception):
        redis = Redis.from_url(settings.redis.url)
        versions["redis"] = (await redis.info("server"))["redis_version"]
        await redis.aclose()
    return versions


async def measure(base: Settings, options: Options, console: Console) -> Report:
    """Run every row; the report (:class:`toolkit.bench.report.Report`).

    Raises:
        WrkMissing, ProfilerMissing, BenchError, ServerFailed: the run could not be completed
            (the subprocess logs are kept and named in the message).
    """
    require_wrk()
    if options.profile_dir is not None:
        options.profile_dir.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id("bench")
    settings = bench_settings(base, run_id)
    log_dir = Path(tempfile.mkdtemp(prefix=f"{run_id}-"))
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    machine = machine_info()
    env = {**os.environ, **environment(settings)}
    ctx = Context(settings, options, env, log_dir, store_pids(), console, {})
    async with AsyncExitStack() as stack:
        stack.push_async_callback(tear_down, settings)
        console.print(f"{run_id}: creating database and topology (logs in {log_dir})", soft_wrap=True)
        await upgrade(settings.db.url)
        engine = make_engine(settings.db.url, pool_size=2, max_overflow=0)
        stack.push_async_callback(engine.dispose)
        machine["versions"] = await _versions(settings, engine)
        rows = await http_rows(ctx)
        if any(options.wants(key) for key, _, _ in DRAIN_ROWS):
            rows += await drain_rows(ctx, engine)
        if any(options.wants(spec.key) for spec in PIPELINE_ROWS):
            rows += await pipeline_rows(ctx, engine, machine["cpus_online"])
    suspicious = any(r.unexpected or r.socket_errors or "never written" in r.note for r in rows)
    if not suspicious:
        shutil.rmtree(log_dir, ignore_errors=True)
    fill_ratios(rows)
    floor = floor_row(rows)
    if floor is not None:
        rows.append(floor)
    return Report(
        run_id=run_id,
        started_at=started_at,
        machine=machine,
        options=options,
        rows=rows,
        targets=judge(rows),
        accept_ceiling=accept_ceiling(rows),
        profiles=ctx.profiles,
        logs=str(log_dir) if suspicious else None,
    )


async def run_bench(base: Settings, options: Options, as_json: bool) -> int:
    """The command: measure, print (tables, or JSON on stdout; progress on stderr); exit status."""
    # Piped (e.g. into a file), rich would wrap the tables at 80 columns; COLUMNS still wins.
    wide = None if os.environ.get("COLUMNS") or sys.stdout.isatty() else 130
    console = Console(stderr=as_json, width=None if as_json else wide)
    try:
        report = await measure(base, options, console)
    except (WrkMissing, profile.ProfilerMissing, BenchError, ServerFailed, OSError, RuntimeError) as exc:
        Console(stderr=True).print(f"flashsale bench: {exc}", soft_wrap=True, highlight=False)
        return 2
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        render(report, console)
    return 0
