"""With Redis away, the API says so and only so: a purchase's 503 names the store that does not
answer (not every store), and readiness's ``redis`` and ``redis_state`` agree."""

from __future__ import annotations

import pytest
import structlog

from service.api import problems
from service.api.app import create_app
from service.settings import Settings
from tests.support import PrivateRedis, buy, eventually, private_server, scratch, serving
from toolkit.sale.isolation import free_port


def _with_redis(settings: Settings, url: str) -> Settings:
    return settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})


async def test_a_worker_started_without_redis_names_redis_alone(settings, token, monkeypatch):
    # a fresh logger: the module's own caches its processors on first use (as in test_error_mapping)
    monkeypatch.setattr(problems, "log", structlog.get_logger(problems.__name__))
    away = _with_redis(settings, f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    async with serving(create_app(away), timeout=30) as client:
        ready = await client.get("/api/v1/health/ready")
        body = ready.json()
        assert ready.status_code == 503 and body["connecting"] is True, body
        assert (body["redis"], body["redis_state"]) == (False, "unreachable"), body
        assert body["rabbitmq"] is True and body["mysql"] is True, body
        answer = await buy(client, token("early"), 1)
        assert answer.status_code == 503 and answer.json()["code"] == "unavailable", answer.text
        assert answer.json()["detail"] == "The service is still connecting to Redis; retry shortly."
        with structlog.testing.capture_logs() as logs:  # every such 503 says why in the log (once a second)
            again = await buy(client, token("early"), 1)
    assert again.status_code == 503
    assert [(entry["event"], entry["cause"]) for entry in logs if entry["event"] == "unavailable_answered"] == [
        ("unavailable_answered", "The service is still connecting to Redis; retry shortly.")
    ]


@pytest.mark.slow  # starts a Redis server of its own
async def test_a_redis_lost_after_start_is_unreachable_in_both_fields(settings):
    async with private_server(PrivateRedis(scratch("redis"), aof=False)) as redis:
        async with serving(create_app(_with_redis(settings, redis.url)), timeout=30) as client:

            async def ready() -> bool:
                return (await client.get("/api/v1/health/ready")).status_code == 200

            await eventually(ready, interval=0.2)
            await redis.kill()
            answer = await client.get("/api/v1/health/ready")
            body = answer.json()
            assert answer.status_code == 503 and body["connecting"] is False, body
            assert (body["redis"], body["redis_state"]) == (False, "unreachable"), body
            assert body["rabbitmq"] is True and body["mysql"] is True, body
