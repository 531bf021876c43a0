"""``415 unsupported_media_type`` for a body that does not say JSON, on every route that takes
one (purchase, admin product, refund, payment notification), before anything is touched."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from service.domain.payments.notification import Notification, signed
from tests.support import order_rows, redis_state

NOT_JSON = [
    {"content-type": "text/plain"},
    {"content-type": "application/xml"},
    {"content-type": "application/x-www-form-urlencoded"},
    {},  # no Content-Type at all
]


def _assert_415(response) -> None:
    assert response.status_code == 415, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "unsupported_media_type"


@pytest.mark.parametrize("headers", NOT_JSON, ids=lambda h: h.get("content-type", "none"))
async def test_purchase_with_a_body_that_is_not_json(
    client, token, put_product, product_id, redis, settings, engine, headers
):
    await put_product(product_id, stock=3, limit=1)
    before = await redis_state(redis, settings, product_id)
    body = json.dumps({"product_id": product_id, "quantity": 1}).encode()
    response = await client.post(
        "/api/v1/orders", content=body, headers={**token("m1"), "Idempotency-Key": "mt-1", **headers}
    )
    _assert_415(response)
    assert await redis_state(redis, settings, product_id) == before  # nothing reserved, nothing published
    assert await order_rows(engine, product_id) == []


async def test_purchase_as_a_form(client, token, put_product, product_id, redis, settings):
    await put_product(product_id, stock=3, limit=1)
    before = await redis_state(redis, settings, product_id)
    response = await client.post("/api/v1/orders", data={"product_id": product_id, "quantity": 1}, headers=token("m2"))
    _assert_415(response)
    assert await redis_state(redis, settings, product_id) == before


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.flashsale+json"]
)
async def test_purchase_with_json_media_types_is_accepted(client, token, put_product, product_id, content_type):
    await put_product(product_id, stock=3, limit=1)
    body = json.dumps({"product_id": product_id, "quantity": 1}).encode()
    response = await client.post("/api/v1/orders", content=body, headers={**token("m3"), "content-type": content_type})
    assert response.status_code == 202, response.text


@pytest.mark.parametrize("headers", NOT_JSON, ids=lambda h: h.get("content-type", "none"))
async def test_admin_product_with_a_body_that_is_not_json(client, admin, product_id, redis, settings, headers):
    body = json.dumps({"stock": 5, "per_user_limit": 1, "price": 100}).encode()
    response = await client.put(f"/api/v1/admin/products/{product_id}", content=body, headers={**admin, **headers})
    _assert_415(response)
    assert (await client.get(f"/api/v1/products/{product_id}")).status_code == 404  # not created
    assert (await redis_state(redis, settings, product_id))["keys"] == []


async def test_admin_product_with_charset_is_accepted(client, admin, product_id):
    body = json.dumps({"stock": 5, "per_user_limit": 1, "price": 100}).encode()
    headers = {**admin, "content-type": "application/json; charset=utf-8"}
    assert (await client.put(f"/api/v1/admin/products/{product_id}", content=body, headers=headers)).status_code == 200


@pytest.mark.parametrize("headers", NOT_JSON, ids=lambda h: h.get("content-type", "none"))
async def test_refund_with_a_body_that_is_not_json(client, admin, headers):
    response = await client.post(
        "/api/v1/admin/orders/FS20261130000000990000010X/refund",
        content=b'{"restock": true}',
        headers={**admin, **headers},
    )
    _assert_415(response)


async def test_refund_and_cancel_without_a_body_are_not_concerned(client, admin, token):
    order_no = "FS20261130000000990000010X"  # malformed on purpose: answered, but not with 415
    refund = await client.post(f"/api/v1/admin/orders/{order_no}/refund", headers=admin)
    cancel = await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token("m4"))
    assert refund.status_code != 415 and cancel.status_code != 415
    assert refund.status_code < 500 and cancel.status_code < 500


@pytest.mark.parametrize("headers", NOT_JSON, ids=lambda h: h.get("content-type", "none"))
async def test_payment_notification_with_a_body_that_is_not_json(client, settings, engine, headers):
    secret = settings.payment.channel_secrets["mockpay"]
    note = Notification("mockpay", "media-type", "FS20261130000000990000010X", 1500, settings.payment.currency, "paid")
    body, signed_headers = signed(secret, note)
    signed_headers.pop("Content-Type")
    response = await client.post("/api/v1/payments/notify", content=body, headers={**signed_headers, **headers})
    _assert_415(response)
    async with engine.connect() as conn:
        found = await conn.execute(text("SELECT COUNT(*) FROM payments WHERE channel_txn_id = 'media-type'"))
        assert found.scalar() == 0
