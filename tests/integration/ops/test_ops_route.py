"""``GET /ops`` guards the page itself; ``GET /api/v1/admin/ops`` is what it polls."""

from __future__ import annotations

from service.api.controllers.ops import TOKEN_COMMAND
from service.api.ops_history import SAMPLE_SECONDS
from service.api.tokens import issue_token


async def test_the_page_needs_an_admin_token(client, token, settings):
    missing = await client.get("/ops")
    assert missing.status_code == 401 and TOKEN_COMMAND in missing.json()["detail"]
    assert "--ttl" in TOKEN_COMMAND
    buyer = token("buyer")["Authorization"].removeprefix("Bearer ")
    assert (await client.get(f"/ops?token={buyer}")).status_code == 403
    forged = issue_token("another-secret-of-32-characters-or-more", "ops", admin=True)
    for bad in ("not.a.jwt", forged):  # forged, malformed: not a token at all (401, as everywhere)
        refused = await client.get(f"/ops?token={bad}")
        assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
        assert "expired or invalid" in refused.json()["detail"] and TOKEN_COMMAND in refused.json()["detail"]
    admin = token("ops", admin=True)["Authorization"].removeprefix("Bearer ")
    page = await client.get(f"/ops?token={admin}")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert f'const TOKEN_COMMAND = "{TOKEN_COMMAND}";' in page.text and "{{" not in page.text
    assert "/api/v1/admin/ops" in page.text and "http" not in page.text.split("<script>")[0].replace("http-equiv", "")
    assert (await client.get("/ops", headers=token("ops", admin=True))).status_code == 200


async def test_the_view_shows_terms_stock_queues_and_purchases(client, token, admin, put_product, product_id):
    await put_product(product_id, stock=3, limit=1, name="Blue kettle", buckets=2, sale_ends_at="2099-01-01T00:00:00Z")
    buy = {"product_id": product_id, "quantity": 1}
    assert (await client.post("/api/v1/orders", json=buy, headers=token("o1"))).status_code == 202
    refused = await client.post("/api/v1/orders", json=buy, headers=token("o1"))
    assert refused.json()["code"] == "limit_exceeded"
    assert (await client.get("/api/v1/admin/ops", headers=token("o1"))).status_code == 403
    view = (await client.get("/api/v1/admin/ops", headers=admin)).json()
    [product] = [p for p in view["products"] if p["terms"]["id"] == product_id]
    stock = product["stock"]
    assert (stock["product_id"], stock["redis_stock_before"], stock["mysql_stock"], stock["in_flight"]) == (
        product_id,
        2,
        3,
        1,
    )
    assert stock["drift"] == 0
    assert view["order_queue"] >= 0 and view["dead_letters"] >= 0
    terms = product["terms"]
    assert (terms["name"], terms["stock_mode"], terms["buckets"]) == ("Blue kettle", "redis", 2)
    assert terms["sale_active"] is True
    assert terms["sale_ends_at"] == "2099-01-01T00:00:00Z" and terms["sale_starts_at"].endswith("Z")
    # the answers so far, split as the page shows them (every process of this test shares the
    # registry, so at least ours), and the worker's ring of them, sampled since it started
    answers = view["answers"]
    assert answers["accepted"] >= 1 and answers["limit_exceeded"] >= 1
    assert view["purchases"]["accepted"] == answers["accepted"]
    assert view["history"] and view["history_every"] == SAMPLE_SECONDS
    assert all(set(sample) == set(answers) for sample in view["history"])
    sampled_at = [sample["at"] for sample in view["history"]]
    assert sampled_at == sorted(sampled_at) and sampled_at[-1] <= answers["at"]
