"""Every route takes exactly the JSON types its schema states (service/api/body.py): no string or
float for an integer, no number for a datetime, no unknown field; an empty or malformed body is
answered with a message that says so. Nothing is written by a refused request."""

from __future__ import annotations

import pytest

LENIENT_PRODUCT_BODIES = [
    ("stock as string", {"stock": "100"}, "stock"),
    ("stock as float", {"stock": 100.0}, "stock"),
    ("stock as bool", {"stock": True}, "stock"),
    ("price as string", {"stock": 1, "price": "5"}, "price"),
    ("limit as float", {"stock": 1, "per_user_limit": 2.0}, "per_user_limit"),
    ("start as epoch", {"stock": 1, "sale_starts_at": 0}, "sale_starts_at"),
    ("start as date only", {"stock": 1, "sale_starts_at": "2030-01-01"}, "sale_starts_at"),
    ("end as epoch", {"stock": 1, "sale_ends_at": 1_900_000_000}, "sale_ends_at"),
    ("name as number", {"stock": 1, "name": 7}, "name"),
    ("unknown field", {"stock": 1, "colour": "red"}, "colour"),
    ("an array", [{"stock": 1}], "body"),
    ("null", None, "body"),
]


def _assert_invalid(response, field: str) -> None:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "invalid_request"
    assert problem["errors"][0]["field"] == field, problem
    assert problem["detail"].startswith(f"{field}: ")


@pytest.mark.parametrize(("name", "body", "field"), LENIENT_PRODUCT_BODIES, ids=[c[0] for c in LENIENT_PRODUCT_BODIES])
async def test_admin_product_put_is_strict(client, admin, new_product_id, name, body, field):
    pid = new_product_id()
    response = await client.put(f"/api/v1/admin/products/{pid}", json=body, headers=admin)
    _assert_invalid(response, field)
    assert (await client.get(f"/api/v1/products/{pid}")).status_code == 404  # nothing created


async def test_admin_product_put_takes_rfc3339_datetimes(client, admin, new_product_id):
    pid = new_product_id()
    body = {"stock": 3, "sale_starts_at": "2026-01-01T00:00:00Z", "sale_ends_at": "2099-01-01T08:00:00+08:00"}
    response = await client.put(f"/api/v1/admin/products/{pid}", json=body, headers=admin)
    assert response.status_code == 200, response.text
    product = (await client.get(f"/api/v1/products/{pid}")).json()
    assert product["sale_starts_at"].startswith("2026-01-01T00:00:00")
    assert product["sale_ends_at"].startswith("2099-01-01T00:00:00")


async def test_an_update_keeps_strict_types_too(client, admin, put_product, product_id):
    await put_product(product_id, stock=5, limit=2)
    response = await client.put(f"/api/v1/admin/products/{product_id}", json={"stock": "9"}, headers=admin)
    _assert_invalid(response, "stock")
    assert (await client.get(f"/api/v1/products/{product_id}")).json()["remaining"] == 5


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/api/v1/orders"), ("PUT", "/api/v1/admin/products/{pid}")],
    ids=["purchase", "admin product"],
)
async def test_an_empty_required_body_says_a_json_object_is_required(client, admin, new_product_id, method, path):
    response = await client.request(method, path.format(pid=new_product_id()), content=b"", headers={**admin, **JSON})
    _assert_invalid(response, "body")
    assert "A JSON object is required" in response.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/api/v1/orders"), ("PUT", "/api/v1/admin/products/{pid}")],
    ids=["purchase", "admin product"],
)
async def test_malformed_json_is_400(client, admin, new_product_id, method, path):
    response = await client.request(
        method, path.format(pid=new_product_id()), content=b'{"stock": ', headers={**admin, **JSON}
    )
    _assert_invalid(response, "body")
    assert response.json()["detail"] == "body: Not valid JSON"


@pytest.mark.parametrize(
    ("body", "field"), [({"restock": 1}, "restock"), ({"restock": "true"}, "restock"), ({"x": 1}, "x")]
)
async def test_refund_options_are_strict(client, admin, body, field):
    response = await client.post("/api/v1/admin/orders/FS202611300129481500000127/refund", json=body, headers=admin)
    _assert_invalid(response, field)


@pytest.mark.parametrize("body", [b"", b"null", b"{}", b'{"restock": false}'])
async def test_refund_takes_no_body_null_or_an_object(client, admin, body):
    """The refund's options are optional: these reach the order lookup (404 for an unknown order)."""
    response = await client.post(
        "/api/v1/admin/orders/FS202611300129481500000127/refund", content=body, headers={**admin, **JSON}
    )
    assert response.status_code == 404 and response.json()["code"] == "order_not_found", response.text


PURCHASE_BODIES = [
    ("quantity as string", b'{"product_id": 1, "quantity": "1"}', "quantity", "Expected `int`, got `str`"),
    ("quantity as float", b'{"product_id": 1, "quantity": 1.0}', "quantity", "Expected `int`, got `float`"),
    ("unknown field", b'{"product_id": 1, "quantity": 1, "coupon": "x"}', "coupon", "unknown field `coupon`"),
    ("an array", b"[1, 1]", "body", "Expected `object`, got `array`"),
    ("null", b"null", "body", "Expected `object`, got `null`"),
    # the typed decode stops at the first wrong field: the syntax error further on still wins
    ("wrong type, then cut off", b'{"quantity": "1", "product_id": ', "body", "Not valid JSON"),
]


@pytest.mark.parametrize(("name", "body", "field", "message"), PURCHASE_BODIES, ids=[c[0] for c in PURCHASE_BODIES])
async def test_the_purchase_body_is_decoded_strictly_naming_the_field(client, token, name, body, field, message):
    """The purchase route decodes its body itself, in one pass (``decode_body``): the same answers
    as the routes that take ``data``."""
    response = await client.post("/api/v1/orders", content=body, headers={**token("strict-buyer"), **JSON})
    _assert_invalid(response, field)
    assert message in response.json()["detail"]
