"""Bad input gets a 4xx problem+json with a stable code and leaves no trace anywhere."""

from __future__ import annotations

import time

import jwt
import pytest
from sqlalchemy import text

from service.adapters.broker import queue_depth
from tests.conftest import redis_state

CASES = [
    # (name, body, extra headers, expected status, expected code)
    ("quantity 0", {"quantity": 0}, {}, 400, "invalid_request"),
    ("quantity -1", {"quantity": -1}, {}, 400, "invalid_request"),
    ("quantity abc", {"quantity": "abc"}, {}, 400, "invalid_request"),
    ("quantity 1.5", {"quantity": 1.5}, {}, 400, "invalid_request"),
    ("quantity true", {"quantity": True}, {}, 400, "invalid_request"),
    ("quantity 10^9", {"quantity": 10**9}, {}, 400, "invalid_request"),
    ("quantity 10^30", {"quantity": 10**30}, {}, 400, "invalid_request"),
    ("quantity over limit", {"quantity": 3}, {}, 400, "invalid_request"),
    ("quantity missing", {"quantity": None}, {}, 400, "invalid_request"),
    ("product_id string", {"product_id": "x"}, {}, 400, "invalid_request"),
    ("product_id 0", {"product_id": 0}, {}, 400, "invalid_request"),
    ("unknown field", {"coupon": "FREE"}, {}, 400, "invalid_request"),
    ("empty key", {}, {"Idempotency-Key": ""}, 400, "invalid_idempotency_key"),
    ("key too long", {}, {"Idempotency-Key": "k" * 65}, 400, "invalid_idempotency_key"),
    ("key with space", {}, {"Idempotency-Key": "a b"}, 400, "invalid_idempotency_key"),
]


def body_for(product_id: int, change: dict) -> dict:
    body = {"product_id": product_id, "quantity": 1, **change}
    return {k: v for k, v in body.items() if v is not None}


@pytest.fixture
async def loaded(put_product, product_id):
    await put_product(product_id, stock=5, limit=2)
    return product_id


async def snapshot(redis, settings, engine, amqp_channel, product_id):
    async with engine.connect() as conn:
        orders = (await conn.execute(text("SELECT COUNT(*) FROM orders WHERE product_id = :p"), {"p": product_id})).scalar()
        stock = (await conn.execute(text("SELECT stock, sold FROM inventory WHERE product_id = :p"), {"p": product_id})).one()
    return {
        "redis": await redis_state(redis, settings, product_id),
        "orders": orders,
        "inventory": tuple(stock),
        "queue": await queue_depth(amqp_channel, settings.amqp.queue),
    }


@pytest.mark.parametrize(("name", "change", "headers", "status", "code"), CASES, ids=[c[0] for c in CASES])
async def test_bad_purchase_input(client, token, loaded, redis, settings, engine, amqp_channel, name, change, headers, status, code):
    before = await snapshot(redis, settings, engine, amqp_channel, loaded)
    response = await client.post("/api/v1/orders", json=body_for(loaded, change), headers={**token("u1"), **headers})
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == code and problem["status"] == status and problem["title"] and problem["detail"]
    if status == 400 and code == "invalid_request":
        assert problem["errors"][0]["field"] in ("quantity", "product_id", "body", "coupon")
    assert await snapshot(redis, settings, engine, amqp_channel, loaded) == before


async def test_not_json_body(client, token, loaded, redis, settings, engine, amqp_channel):
    before = await snapshot(redis, settings, engine, amqp_channel, loaded)
    response = await client.post("/api/v1/orders", content=b"{not json", headers={**token("u1"), "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"
    assert await snapshot(redis, settings, engine, amqp_channel, loaded) == before


async def test_missing_product_is_404(client, token, new_product_id):
    response = await client.post("/api/v1/orders", json={"product_id": new_product_id(), "quantity": 1}, headers=token("u1"))
    assert response.status_code == 404 and response.json()["code"] == "product_not_found"


def _token(settings, **claims) -> str:
    payload = {"sub": "u1", "exp": int(time.time()) + 60, "iat": int(time.time()), **claims}
    return jwt.encode(payload, claims.pop("secret", settings.auth.jwt_secret), algorithm="HS256")


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer", "Bearer not-a-jwt", "Basic dTE6cHc=", "expired", "wrong-secret", "bad-sub", "no-exp"],
)
async def test_bad_tokens_are_401_with_no_side_effects(client, loaded, redis, settings, engine, amqp_channel, authorization):
    now = int(time.time())
    special = {
        "expired": jwt.encode({"sub": "u1", "exp": now - 10, "iat": now - 100}, settings.auth.jwt_secret, algorithm="HS256"),
        "wrong-secret": jwt.encode({"sub": "u1", "exp": now + 60, "iat": now}, "x" * 40, algorithm="HS256"),
        "bad-sub": jwt.encode({"sub": "a|b", "exp": now + 60, "iat": now}, settings.auth.jwt_secret, algorithm="HS256"),
        "no-exp": jwt.encode({"sub": "u1", "iat": now}, settings.auth.jwt_secret, algorithm="HS256"),
    }
    header = f"Bearer {special[authorization]}" if authorization in special else authorization
    before = await snapshot(redis, settings, engine, amqp_channel, loaded)
    response = await client.post(
        "/api/v1/orders", json={"product_id": loaded, "quantity": 1}, headers={"Authorization": header} if header else {}
    )
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "unauthorized"
    assert await snapshot(redis, settings, engine, amqp_channel, loaded) == before


async def test_admin_routes_need_the_admin_role(client, token, loaded):
    response = await client.put(f"/api/v1/admin/products/{loaded}", json={"stock": 1000}, headers=token("u1"))
    assert response.status_code == 403 and response.json()["code"] == "forbidden"


async def test_malformed_order_number_is_rejected_before_any_lookup(client, token):
    for bad in ("FS2026", "FS202611300129481500000128", "fs202611300129481500000127", "FS20261130012948150000012X"):
        response = await client.get(f"/api/v1/orders/{bad}", headers=token("u1"))
        assert response.status_code == 400 and response.json()["code"] == "invalid_order_no", bad


async def test_bad_product_input(client, admin, new_product_id):
    pid = new_product_id()
    for body in ({"stock": -1}, {"stock": 1, "per_user_limit": 0}, {"stock": 1, "price": -5},
                 {"stock": 1, "sale_starts_at": "2030-01-02T00:00:00Z", "sale_ends_at": "2030-01-01T00:00:00Z"}):
        response = await client.put(f"/api/v1/admin/products/{pid}", json=body, headers=admin)
        assert response.status_code == 400, body
        assert response.json()["code"] == "invalid_request"
    assert (await client.get(f"/api/v1/products/{pid}")).status_code == 404
