"""``GET /ops`` serves the page to anyone; ``GET /api/v1/admin/ops`` (admin) is what it polls."""

from __future__ import annotations

from service.api.controllers.ops import TOKEN_COMMAND
from service.api.ops_history import SAMPLE_SECONDS
from service.api.tokens import issue_token


async def test_the_page_is_served_to_anyone_and_decodes_no_token(client, token):
    """The page holds no data: served without a token. A token in the query string is not read
    (the page takes it from its fragment, ``/ops#token=``), so even a forged one gets the page."""
    forged = issue_token("another-secret-of-32-characters-or-more", "ops", admin=True)
    for path in ("/ops", "/ops?token=not.a.jwt", f"/ops?token={forged}"):
        page = await client.get(path)
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8", path
        assert page.headers["cache-control"] == "no-store"
    assert f'const TOKEN_COMMAND = "{TOKEN_COMMAND}";' in page.text and "{{" not in page.text
    assert "--ttl" in TOKEN_COMMAND
    assert "/api/v1/admin/ops" in page.text and "http" not in page.text.split("<script>")[0].replace("http-equiv", "")
    assert '<link rel="icon" href="data:,">' in page.text  # no favicon request to answer 404
    # what the page polls is the admin's
    assert (await client.get("/api/v1/admin/ops")).status_code == 401
    assert (await client.get("/api/v1/admin/ops", headers=token("buyer"))).status_code == 403
    assert (await client.get("/api/v1/admin/ops/waiting-rooms", headers=token("buyer"))).status_code == 403


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
