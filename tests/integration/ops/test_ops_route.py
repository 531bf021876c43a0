"""``GET /ops`` guards the page itself; ``GET /api/v1/admin/ops`` is what it polls."""

from __future__ import annotations

from service.api.tokens import issue_token


async def test_the_page_needs_an_admin_token(client, token, settings):
    assert (await client.get("/ops")).status_code == 401
    buyer = token("buyer")["Authorization"].removeprefix("Bearer ")
    assert (await client.get(f"/ops?token={buyer}")).status_code == 403
    forged = issue_token("another-secret-of-32-characters-or-more", "ops", admin=True)
    for bad in ("not.a.jwt", forged):  # forged, malformed: not a token at all (401, as everywhere)
        refused = await client.get(f"/ops?token={bad}")
        assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
    admin = token("ops", admin=True)["Authorization"].removeprefix("Bearer ")
    page = await client.get(f"/ops?token={admin}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/api/v1/admin/ops" in page.text and "http" not in page.text.split("<script>")[0].replace("http-equiv", "")
    assert (await client.get("/ops", headers=token("ops", admin=True))).status_code == 200


async def test_the_view_shows_stock_queues_and_purchases(client, token, admin, put_product, product_id):
    await put_product(product_id, stock=3, limit=1)
    assert (
        await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token("o1"))
    ).status_code == 202
    assert (await client.get("/api/v1/admin/ops", headers=token("o1"))).status_code == 403
    view = (await client.get("/api/v1/admin/ops", headers=admin)).json()
    [product] = [p for p in view["products"] if p["product_id"] == product_id]
    assert (product["redis_stock_before"], product["mysql_stock"], product["in_flight"], product["drift"]) == (
        2,
        3,
        1,
        0,
    )
    assert view["order_queue"] >= 0 and view["dead_letters"] >= 0
    assert view["purchases"]["accepted"] >= 1
