"""The fleet limit of order-number shards (90 Redis-leased shards, 00-89: one per API worker
process and key prefix): reported by readiness; a worker that finds every shard leased says so
once and stops the server with exit code 3 instead of a granian crash loop. On a private Redis
whose shards the test leases."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator

import httpx
import pytest

from service.adapters.redis.stores import make_stores
from service.api.no_shard import EXIT_NO_SHARD
from service.bootstrap import open_api
from service.domain.order_numbers.format import REDIS_SHARDS
from service.domain.order_numbers.minter import ShardsExhausted
from service.settings import Settings
from tests.support import api_ready, eventually, private_redis, start_flashsale
from toolkit.sale.isolation import free_port


@contextlib.asynccontextmanager
async def shards_taken(settings: Settings, leave_free: int) -> AsyncIterator[Settings]:
    """``settings`` on a private Redis where another holder leases all shards but ``leave_free``."""
    async with private_redis() as url:
        own = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})
        store = make_stores(own)
        try:
            for shard in range(REDIS_SHARDS - leave_free):
                assert await store.leases.shard(shard).acquire("someone-else", 600_000)
            yield own
        finally:
            await store.aclose()


async def test_readiness_reports_shards_leased_and_free(client):
    body = (await client.get("/api/v1/health/ready")).json()
    assert body["shards_total"] == REDIS_SHARDS == 90
    assert body["shards_leased"] >= 1  # this API's own
    assert body["shards_free"] == REDIS_SHARDS - body["shards_leased"]


async def test_opening_the_purchase_path_with_every_shard_leased_raises_shards_exhausted(settings):
    async with shards_taken(settings, leave_free=0) as own:
        with pytest.raises(ShardsExhausted, match="all 90 Redis order-number shards"):
            await open_api(own)


def _finished(process: subprocess.Popen, timeout: float) -> int:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


@pytest.mark.slow
async def test_serve_with_fewer_free_shards_than_workers_exits_3_before_starting(settings, tmp_path):
    async with shards_taken(settings, leave_free=1) as own:
        log = tmp_path / "serve.log"
        env = {**os.environ, **_env(own)}
        process = start_flashsale(["serve", "--port", str(free_port()), "--workers", "2"], env, log)
        assert await asyncio.to_thread(_finished, process, 60) == EXIT_NO_SHARD
        output = log.read_text()
        assert "flashsale serve: 2 workers need 2 order-number shards, 1 of 90 are free" in output
        assert "at most 90 API worker processes per key prefix" in output
        assert "Spawning worker" not in output  # no granian worker was started


@pytest.mark.slow
async def test_a_worker_that_finds_every_shard_leased_stops_the_server_once_with_exit_3(settings, tmp_path):
    """A rolling restart (SIGHUP: granian starts the new worker while the old one still holds
    the last free shard) on a full fleet: the new worker cannot lease a shard."""
    async with shards_taken(settings, leave_free=1) as own:
        port = free_port()
        log = tmp_path / "serve.log"
        process = start_flashsale(["serve", "--port", str(port), "--workers", "1"], {**os.environ, **_env(own)}, log)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                await eventually(lambda: api_ready(http), interval=0.2)
                body = (await http.get("/api/v1/health/ready")).json()
                assert (body["shards_leased"], body["shards_free"]) == (REDIS_SHARDS, 0)
            os.kill(process.pid, signal.SIGHUP)
            assert await asyncio.to_thread(_finished, process, 60) == EXIT_NO_SHARD
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        output = log.read_text()
        assert output.count('"event": "order_no_shards_exhausted"') == 1, output[-3000:]
        assert "flashsale serve: all 90 Redis order-number shards (00-89) are leased" in output
        assert "Worker crash loop" not in output


def _env(settings: Settings) -> dict[str, str]:
    from toolkit.sale.isolation import environment

    return environment(settings)
