"""Every long-running process starts while a store is down and becomes ready by itself when it
returns: ``serve`` (no granian crash loop: readiness 503 ``connecting``, purchases 503
``unavailable``), ``consume`` (waits instead of exiting), ``realign --watch`` and ``sweep
--watch`` (also outlive outages while running, one log line per outage, never a traceback).

The store that goes down is a private server of the test's own (tests/servers.py) on a free
port: started only after the process, killed with SIGKILL and started again. The others are the
run's (isolated database, key prefix and queue names).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import msgspec
import pytest

from db.migrate import upgrade
from service.api.tokens import issue_token
from service.bootstrap import open_job, opened
from service.domain.stock.catalog import ProductInput
from service.settings import Settings
from tests.support import (
    PATIENCE,
    PrivateMariaDB,
    PrivateRabbitMQ,
    PrivateRedis,
    api_in_loop,
    buy,
    eventually,
    order_rows,
    private_server,
    rows_at_least,
    scratch,
    start_flashsale,
)
from toolkit.sale.isolation import environment, free_port

pytestmark = pytest.mark.slow  # starts private servers and flashsale processes

CRASH_LOOP_WINDOW = 7.0
"""Seconds a process must stay up while its store is down: granian ends a worker crash loop
after about 5 s (two crashes), the old ``consume`` exited at once."""


def _with(settings: Settings, **urls: str) -> Settings:
    """``settings`` with the given store URLs (``redis=``, ``amqp=``, ``db=``)."""
    update = {group: getattr(settings, group).model_copy(update={"url": url}) for group, url in urls.items()}
    return settings.model_copy(update=update)


def _start(settings: Settings, log: Path, *argv: str):
    return start_flashsale(list(argv), {**os.environ, **environment(settings)}, log)


def _stop(process) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(20)
            return
        except ProcessLookupError:
            return
        except Exception:
            continue


def _log_lines(log: Path) -> list[dict]:
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = None
        lines.append(parsed if isinstance(parsed, dict) else {"raw": line})
    return lines


def _no_traceback(log: Path) -> None:
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]


async def _readiness(url: str) -> tuple[int, dict] | None:
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            response = await http.get(f"{url}/api/v1/health/ready")
            return response.status_code, response.json()
    except (httpx.HTTPError, ValueError):
        return None


def _waiting(*logs: Path):
    """An async check for :func:`eventually`: every one of ``logs`` has a line saying its process
    waits for a store (or that a pass is failing)."""

    async def check() -> bool:
        return all(any(str(line.get("event", "")).endswith("_failing") for line in _log_lines(log)) for log in logs)

    return check


async def _stays_up(process, seconds: float) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("store", ["rabbitmq", "redis"])
async def test_serve_starts_while_a_store_is_down_and_becomes_ready_when_it_returns(
    settings, store, tmp_path, new_product_id
):
    server = PrivateRabbitMQ(scratch("rabbitmq")) if store == "rabbitmq" else PrivateRedis(scratch("redis"))
    mine = _with(settings, amqp=server.url) if store == "rabbitmq" else _with(settings, redis=server.url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    async with private_server(server, start=False):
        serve = _start(mine, log, "serve", "--port", str(port), "--workers", "2")
        try:

            async def connecting():
                answer = await _readiness(url)
                return answer is not None and answer[0] == 503 and answer[1]["connecting"] and answer

            _, body = await eventually(connecting, interval=0.2)
            assert body[store] is False and body["mysql"] is True
            token = {"Authorization": f"Bearer {issue_token(mine.auth.jwt_secret, 'early')}"}
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                early = await buy(http, token, new_product_id(), key="early-key")
            assert early.status_code == 503 and early.json()["code"] == "unavailable", early.text
            assert "retry-after" in early.headers
            await _stays_up(serve, CRASH_LOOP_WINDOW)

            await server.start()

            async def ready():
                answer = await _readiness(url)
                return answer is not None and answer[0] == 200

            await eventually(ready, interval=0.2)
            admin = {"Authorization": f"Bearer {issue_token(mine.auth.jwt_secret, 'admin', admin=True)}"}
            product_id = new_product_id()
            body = {"stock": 5, "per_user_limit": 1, "price": 100, "stock_mode": "redis"}

            async def product_set() -> bool:
                # readiness 200 came from one worker; the other may still be connecting (a 503)
                async with httpx.AsyncClient(base_url=url, timeout=30) as fresh:
                    put = await fresh.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
                assert put.status_code in (200, 503), put.text
                return put.status_code == 200

            await eventually(product_set, interval=0.2)
            for user in range(5):  # new connections, either worker: each connects by itself (a 503 meanwhile)
                buyer = {"Authorization": f"Bearer {issue_token(mine.auth.jwt_secret, f'u{user}')}"}

                async def accepted(buyer=buyer, user=user) -> bool:
                    async with httpx.AsyncClient(base_url=url, timeout=30) as fresh:
                        answer = await buy(fresh, buyer, product_id, key=f"u{user}-key")
                    assert answer.status_code in (202, 503), answer.text
                    return answer.status_code == 202

                await eventually(accepted, timeout=PATIENCE, interval=0.2)
            assert serve.poll() is None
        finally:
            _stop(serve)
    stderr = log.read_text(errors="replace")
    assert "starting anyway" in stderr, stderr[-2000:]
    assert "crash loop" not in stderr.lower()
    _no_traceback(log)
    lines = _log_lines(log)
    waits = [line for line in lines if line.get("event") == "dependency_failing"]
    # one line per worker for the whole outage; on a failure, every line's event says what was logged
    assert 1 <= len(waits) <= 2, [line.get("event") or str(line.get("raw"))[:160] for line in lines]


async def test_consume_waits_for_rabbitmq_and_mysql_instead_of_exiting(settings, tmp_path, new_product_id):
    rabbitmq, mariadb = PrivateRabbitMQ(scratch("rabbitmq")), PrivateMariaDB(scratch("mariadb"))
    mine = _with(settings, amqp=rabbitmq.url, db=mariadb.url("flashsale_consume"))
    log = tmp_path / "consume.log"
    async with private_server(rabbitmq, start=False), private_server(mariadb, start=False):
        consume = _start(mine, log, "consume")
        try:
            await _stays_up(consume, CRASH_LOOP_WINDOW)
            await mariadb.start()
            await upgrade(mine.db.url)
            await _stays_up(consume, 2)
            await rabbitmq.start()
            product_id = new_product_id()
            async with api_in_loop(mine) as api:
                admin = {"Authorization": f"Bearer {issue_token(mine.auth.jwt_secret, 'admin', admin=True)}"}
                body = {"stock": 5, "per_user_limit": 1, "price": 100, "stock_mode": "redis"}
                put = await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
                assert put.status_code == 200, put.text
                token = {"Authorization": f"Bearer {issue_token(mine.auth.jwt_secret, 'buyer')}"}
                accepted = await buy(api, token, product_id)
                assert accepted.status_code == 202, accepted.text
                from db.engine import make_engine

                engine = make_engine(mine.db.url, pool_size=2)
                try:
                    await eventually(lambda: rows_at_least(engine, product_id, 1), interval=0.2)
                    assert [row.order_no for row in await order_rows(engine, product_id)] == [
                        accepted.json()["order_no"]
                    ]
                finally:
                    await engine.dispose()
            assert consume.poll() is None
            before_kill = log.read_text(errors="replace")
            # SIGTERM while the broker is away again: it stops within its bounds, exit 0.
            await rabbitmq.kill()
            await asyncio.sleep(1)
            os.killpg(consume.pid, signal.SIGTERM)
            await asyncio.to_thread(consume.wait, 30)
        finally:
            _stop(consume)
    assert "Traceback" not in before_kill, before_kill[-3000:]  # aiormq logs the reset of the kill itself
    lines = _log_lines(log)
    assert lines[-1].get("event") == "stopped", lines[-3:]
    assert any(line.get("event") == "dependency_failing" for line in lines)
    assert sum(line.get("event") == "dependency_failing" for line in lines) <= 2, lines  # per wait, not per try
    assert consume.returncode == 0


async def test_realign_and_sweep_watch_wait_for_stores_and_outlive_outages(settings, tmp_path, new_product_id):
    """Started with Redis down, both wait; then Redis is killed (restarted empty: realignment
    loads the product again) and MariaDB is killed, each for a few seconds: both keep running,
    write one line per outage, and realignment makes Redis = MySQL again by itself."""
    redis, mariadb = PrivateRedis(scratch("redis"), aof=False), PrivateMariaDB(scratch("mariadb"))
    mine = _with(settings, redis=redis.url, db=mariadb.url("flashsale_watch"))
    realign_log, sweep_log = tmp_path / "realign.log", tmp_path / "sweep.log"
    product_id = new_product_id()
    async with private_server(redis, start=False), private_server(mariadb):
        await upgrade(mine.db.url)
        realign = _start(mine, realign_log, "realign", "--watch", "0.5", "--json")
        sweep = _start(mine, sweep_log, "sweep", "--watch", "0.5", "--json")
        try:
            # Both reached their wait on Redis (a slow start on a busy machine would otherwise
            # meet Redis already up, and the wait at start would write no line).
            await eventually(_waiting(realign_log, sweep_log), timeout=PATIENCE, interval=0.2)
            await _stays_up(realign, 1)
            assert sweep.poll() is None
            await redis.start()
            async with opened(open_job(mine, publish=False)) as resources:
                terms = msgspec.convert({"stock": 7, "per_user_limit": 1, "stock_mode": "redis"}, ProductInput)
                await resources.catalog.set(product_id, terms)

                async def aligned() -> bool:
                    try:
                        return await resources.store.stock.units(product_id) == 7
                    except Exception:
                        return False

                async def passing() -> bool:  # both opened their connections and run passes
                    return '"product_id"' in realign_log.read_text() and '"cancelled"' in sweep_log.read_text()

                await eventually(passing, interval=0.2)
                for outage in ("redis", "mariadb"):
                    server = redis if outage == "redis" else mariadb
                    await server.kill()
                    await asyncio.sleep(4)
                    assert realign.poll() is None and sweep.poll() is None, outage
                    await server.start()
                    await eventually(aligned, timeout=PATIENCE, interval=0.2)
                passes_before = realign_log.read_text().count('"product_id"')
                await asyncio.sleep(2)
                assert realign_log.read_text().count('"product_id"') > passes_before  # still passing
            assert realign.poll() is None and sweep.poll() is None
        finally:
            _stop(realign)
            _stop(sweep)
    for log, event in ((realign_log, "realign_pass"), (sweep_log, "sweep_pass")):
        _no_traceback(log)
        lines = _log_lines(log)
        failing = [line for line in lines if line.get("event") in (f"{event}_failing", "dependency_failing")]
        # the wait at start, then one per outage (a restarted Redis may be met once more while loading)
        assert 2 <= len(failing) <= 5, (log.name, failing)  # sweep needs no Redis when nothing is due
        assert any(line.get("event") == f"{event}_recovered" for line in lines), log.name
