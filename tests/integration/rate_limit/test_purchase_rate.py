"""Purchase rate limits per user and per client address, counted in Redis inside the reserve
call (shared by every API process): 429 problem+json with Retry-After, exact counts under real
concurrency, no trace left by a limited request, admin routes not limited."""

from __future__ import annotations

import asyncio

import pytest

from service.api.app import create_app
from tests.support import redis_state, serving

SLOW_RATE = 0.01  # one request per 100 s: nothing refills during a test, so counts are exact


def _limited_settings(settings, **limits):
    rate_limit = settings.rate_limit.model_copy(update=limits)
    return settings.model_copy(update={"rate_limit": rate_limit, "db": settings.db.model_copy(update={"pool_size": 4})})


@pytest.fixture(scope="module")
async def user_limited(settings):
    limits = {"user_per_second": SLOW_RATE, "user_burst": 5, "address_per_second": 0.0}
    async with serving(create_app(_limited_settings(settings, **limits)), timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
async def address_limited(settings):
    limits = {"user_per_second": 0.0, "address_per_second": SLOW_RATE, "address_burst": 7}
    async with serving(create_app(_limited_settings(settings, **limits)), timeout=30) as client:
        yield client


async def _burst(client, token, product_id: int, users: list[str]):
    body = {"product_id": product_id, "quantity": 1}
    return await asyncio.gather(*(client.post("/api/v1/orders", json=body, headers=token(u)) for u in users))


def _assert_limited(response) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "too_many_requests"
    assert int(response.headers["retry-after"]) >= 1


async def test_one_user_gets_exactly_the_burst(user_limited, token, put_product, product_id, redis, settings):
    await put_product(product_id, stock=1000, limit=1000)
    responses = await _burst(user_limited, token, product_id, ["hasty"] * 60)
    accepted = [r for r in responses if r.status_code == 202]
    assert len(accepted) == 5
    for response in responses:
        if response.status_code != 202:
            _assert_limited(response)
    state = await redis_state(redis, settings, product_id)
    assert len(state["journal"]) == 5 and int(state["stock"]) == 995  # a limited request reserved nothing
    # other users are not touched by one user's limit
    assert [r.status_code for r in await _burst(user_limited, token, product_id, ["calm-1", "calm-2"])] == [202, 202]


async def test_one_address_gets_exactly_its_burst_across_users(
    address_limited, token, put_product, product_id, redis, settings
):
    await put_product(product_id, stock=1000, limit=1)
    responses = await _burst(address_limited, token, product_id, [f"crowd-{i}" for i in range(50)])
    assert sum(r.status_code == 202 for r in responses) == 7
    assert sum(r.status_code == 429 for r in responses) == 43
    assert len((await redis_state(redis, settings, product_id))["journal"]) == 7


async def test_limits_are_per_product(user_limited, token, put_product, new_product_id):
    first, second = new_product_id(), new_product_id()
    for pid in (first, second):
        await put_product(pid, stock=100, limit=100)
    assert sum(r.status_code == 202 for r in await _burst(user_limited, token, first, ["both"] * 8)) == 5
    assert sum(r.status_code == 202 for r in await _burst(user_limited, token, second, ["both"] * 8)) == 5


async def test_admin_routes_are_not_limited(user_limited, admin, new_product_id):
    pid = new_product_id()
    body = {"stock": 3, "per_user_limit": 1}
    answers = await asyncio.gather(
        *(user_limited.put(f"/api/v1/admin/products/{pid}", json=body, headers=admin) for _ in range(20))
    )
    assert [a.status_code for a in answers] == [200] * 20
