"""Bad input gets a 4xx problem+json with a stable code and leaves no trace anywhere."""

from __future__ import annotations

import time

import jwt
import pytest
from sqlalchemy import text

from service.adapters.broker_topology import queue_depth
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.model.order_message import OrderMessage, encode_order
from tests.support import eventually, publish_raw, redis_state, rows_at_least

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
        orders = (
            await conn.execute(text("SELECT COUNT(*) FROM orders WHERE product_id = :p"), {"p": product_id})
        ).scalar()
        stock = (
            await conn.execute(text("SELECT stock, sold FROM inventory WHERE product_id = :p"), {"p": product_id})
        ).one()
    return {
        "redis": await redis_state(redis, settings, product_id),
        "orders": orders,
        "inventory": tuple(stock),
        "queue": await queue_depth(amqp_channel, settings.amqp.queue),
    }


@pytest.mark.parametrize(("name", "change", "headers", "status", "code"), CASES, ids=[c[0] for c in CASES])
async def test_bad_purchase_input(
    client, token, loaded, redis, settings, engine, amqp_channel, name, change, headers, status, code
):
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
    response = await client.post(
        "/api/v1/orders", content=b"{not json", headers={**token("u1"), "content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"
    assert await snapshot(redis, settings, engine, amqp_channel, loaded) == before


async def test_missing_product_is_404(client, token, new_product_id):
    response = await client.post(
        "/api/v1/orders", json={"product_id": new_product_id(), "quantity": 1}, headers=token("u1")
    )
    assert response.status_code == 404 and response.json()["code"] == "product_not_found"


def _token(settings, **claims) -> str:
    payload = {"sub": "u1", "exp": int(time.time()) + 60, "iat": int(time.time()), **claims}
    return jwt.encode(payload, claims.pop("secret", settings.auth.jwt_secret), algorithm="HS256")


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer", "Bearer not-a-jwt", "Basic dTE6cHc=", "expired", "wrong-secret", "bad-sub", "no-exp"],
)
async def test_bad_tokens_are_401_with_no_side_effects(
    client, loaded, redis, settings, engine, amqp_channel, authorization
):
    now = int(time.time())
    special = {
        "expired": jwt.encode(
            {"sub": "u1", "exp": now - 10, "iat": now - 100}, settings.auth.jwt_secret, algorithm="HS256"
        ),
        "wrong-secret": jwt.encode({"sub": "u1", "exp": now + 60, "iat": now}, "x" * 40, algorithm="HS256"),
        "bad-sub": jwt.encode({"sub": "a|b", "exp": now + 60, "iat": now}, settings.auth.jwt_secret, algorithm="HS256"),
        "no-exp": jwt.encode({"sub": "u1", "iat": now}, settings.auth.jwt_secret, algorithm="HS256"),
    }
    header = f"Bearer {special[authorization]}" if authorization in special else authorization
    before = await snapshot(redis, settings, engine, amqp_channel, loaded)
    response = await client.post(
        "/api/v1/orders",
        json={"product_id": loaded, "quantity": 1},
        headers={"Authorization": header} if header else {},
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
    for body in (
        {"stock": -1},
        {"stock": 1, "per_user_limit": 0},
        {"stock": 1, "price": -5},
        {"stock": 1, "sale_starts_at": "2030-01-02T00:00:00Z", "sale_ends_at": "2030-01-01T00:00:00Z"},
    ):
        response = await client.put(f"/api/v1/admin/products/{pid}", json=body, headers=admin)
        assert response.status_code == 400, body
        assert response.json()["code"] == "invalid_request"
    assert (await client.get(f"/api/v1/products/{pid}")).status_code == 404


# Regression tests from the adversarial review.


async def test_values_with_a_trailing_newline_are_refused(
    client, token, settings, amqp_channel, put_product, product_id, engine, consumer
):
    """Guards: `$`-anchored checks let an order number, a JWT subject or a queued message carry a trailing newline."""
    await put_product(product_id, stock=5, limit=1)
    good = compose_order_no("FS", "20261130000003", 94, 1)
    response = await client.get(f"/api/v1/orders/{good}%0A", headers=token("u"))
    assert response.status_code == 400 and response.json()["code"] == "invalid_order_no"
    now = int(time.time())
    newline_sub = jwt.encode(
        {"sub": "mallory\n", "exp": now + 60, "iat": now}, settings.auth.jwt_secret, algorithm="HS256"
    )
    assert (await client.get("/api/v1/orders", headers={"Authorization": f"Bearer {newline_sub}"})).status_code == 401

    dead_before = await queue_depth(amqp_channel, settings.amqp.dead_letter_queue)
    poison = OrderMessage(mint_request_id(), good + "\n", "zed", product_id, 1, 0, 1500)
    await publish_raw(amqp_channel, settings, encode_order(poison))
    after = OrderMessage(
        mint_request_id(), compose_order_no("FS", "20261130000003", 94, 2), "zed", product_id, 1, 0, 1500
    )
    await publish_raw(amqp_channel, settings, encode_order(after))
    await eventually(lambda: rows_at_least(engine, product_id, 1))
    await eventually(lambda: _depth_above(amqp_channel, settings.amqp.dead_letter_queue, dead_before))


async def _depth_above(channel, queue, before):
    return await queue_depth(channel, queue) > before


async def test_amounts_that_cannot_fit_bigint_and_ids_out_of_range_are_400(client, admin, new_product_id):
    """Guards: prices and ids beyond BIGINT (or 0) reached MySQL and failed with a 500."""
    pid = new_product_id()
    body = {"stock": 5, "price": 2**62, "per_user_limit": 2}
    response = await client.put(f"/api/v1/admin/products/{pid}", json=body, headers=admin)
    assert response.status_code == 400
    for bad in (2**63, 2**64, 0):
        assert (await client.put(f"/api/v1/admin/products/{bad}", json={"stock": 1}, headers=admin)).status_code == 400
        assert (await client.get(f"/api/v1/products/{bad}")).status_code in (400, 404)


async def test_deeply_nested_json_is_400(client, token):
    """Guards: a deeply nested JSON body crashed the decoder with a 500 instead of a 400."""
    nested = b"[" * 100_000 + b"]" * 100_000
    response = await client.post(
        "/api/v1/orders", content=nested, headers={**token("u"), "content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"


@pytest.mark.parametrize("value", ["1", 1.0, "1e0"])
async def test_quantity_of_the_wrong_type_is_refused(client, token, put_product, product_id, value, redis, settings):
    """Guards: a quantity given as a string or float was coerced and reserved stock."""
    await put_product(product_id, stock=5, limit=2)
    response = await client.post(
        "/api/v1/orders", json={"product_id": product_id, "quantity": value}, headers=token("typed")
    )
    assert response.status_code == 400 and response.json()["errors"][0]["field"] == "quantity"
    assert (await redis_state(redis, settings, product_id))["journal"] == {}
