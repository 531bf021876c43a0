"""Readiness reports a Redis that may evict keys (an evicted quota or journal loses data):
``maxmemory-policy`` other
than ``noeviction``, read at start and again when the probe finds the last read old; a Redis
whose CONFIG is denied is tolerated. On a private Redis (its configuration is changed)."""

from __future__ import annotations

from redis.asyncio import Redis

from service.adapters.redis import eviction
from service.api.app import create_app
from tests.support import private_redis, serving


def _on(settings, url: str):
    return settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})


async def test_readiness_reports_a_redis_that_may_evict_keys(settings, monkeypatch):
    monkeypatch.setattr(eviction, "REFRESH_SECONDS", 0.0)  # every probe reads the policy again
    async with private_redis() as url:
        raw = Redis.from_url(url, decode_responses=True)
        try:
            await raw.config_set("maxmemory-policy", "allkeys-lru")
            async with serving(create_app(_on(settings, url)), timeout=30) as api:
                ready = await api.get("/api/v1/health/ready")
                assert ready.status_code == 503, ready.text
                body = ready.json()
                assert (body["redis"], body["redis_may_evict"], body["redis_maxmemory_policy"]) == (
                    True,
                    True,
                    "allkeys-lru",
                )

                await raw.config_set("maxmemory-policy", "noeviction")  # the operator fixes it
                ready = await api.get("/api/v1/health/ready")
                assert ready.status_code == 200, ready.text
                assert (ready.json()["redis_may_evict"], ready.json()["redis_maxmemory_policy"]) == (
                    False,
                    "noeviction",
                )

                await raw.config_set("maxmemory-policy", "volatile-ttl")  # changed behind the API's back
                assert (await api.get("/api/v1/health/ready")).status_code == 503
                await raw.config_set("maxmemory-policy", "noeviction")

                # A Redis that denies CONFIG (a managed service): the policy is unknown, not held against readiness.
                await raw.execute_command("ACL", "SETUSER", "default", "-config")
                ready = await api.get("/api/v1/health/ready")
                assert ready.status_code == 200, ready.text
                assert (ready.json()["redis_may_evict"], ready.json()["redis_maxmemory_policy"]) == (False, None)
        finally:
            await raw.aclose()
