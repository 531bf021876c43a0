"""Product updates through the admin route: stock and sale window kept right across repeats."""

from __future__ import annotations

import asyncio

from tests.support import buy, eventually, inventory, rows_at_least


async def test_setting_the_same_stock_again_mid_sale_does_not_oversell(
    client, token, put_product, product_id, engine, consumer
):
    """Guards: re-running `product set` with the same stock mid-sale put sold units back on sale (oversell)."""
    await put_product(product_id, stock=10, limit=1)
    first = await asyncio.gather(*(buy(client, token(f"a{i}"), product_id) for i in range(6)))
    assert all(r.status_code == 202 for r in first)
    await eventually(lambda: rows_at_least(engine, product_id, 6))
    report = await put_product(product_id, stock=10, limit=1)
    assert (report["mysql_stock"], report["mysql_sold"], report["redis_stock_after"]) == (4, 6, 4)
    second = await asyncio.gather(*(buy(client, token(f"b{i}"), product_id) for i in range(10)))
    assert sum(r.status_code == 202 for r in second) == 4
    await eventually(lambda: rows_at_least(engine, product_id, 10))
    assert await inventory(engine, product_id) == (0, 10)


async def test_repeating_a_product_update_keeps_its_sale_window(client, admin, new_product_id):
    """Guards: an update that left out the sale window reset it (sale opened now, end dropped)."""
    pid = new_product_id()
    scheduled = {"stock": 5, "sale_starts_at": "2030-01-01T00:00:00Z", "sale_ends_at": "2030-01-02T00:00:00Z"}
    assert (await client.put(f"/api/v1/admin/products/{pid}", json=scheduled, headers=admin)).status_code == 200
    assert (await client.put(f"/api/v1/admin/products/{pid}", json={"stock": 5}, headers=admin)).status_code == 200
    product = (await client.get(f"/api/v1/products/{pid}")).json()
    assert (product["sale_starts_at"], product["sale_ends_at"], product["sale_active"]) == (
        "2030-01-01T00:00:00Z",
        "2030-01-02T00:00:00Z",
        False,
    )
    open_ended = await client.put(
        f"/api/v1/admin/products/{pid}", json={"stock": 5, "sale_ends_at": None}, headers=admin
    )
    assert open_ended.status_code == 200
    assert (await client.get(f"/api/v1/products/{pid}")).json()["sale_ends_at"] is None
    backwards = {"stock": 5, "sale_ends_at": "2029-12-31T00:00:00Z"}  # before the kept start
    response = await client.put(f"/api/v1/admin/products/{pid}", json=backwards, headers=admin)
    assert response.status_code == 400 and response.json()["errors"][0]["field"] == "sale_ends_at"
    assert (await client.get(f"/api/v1/products/{pid}")).json()["sale_ends_at"] is None


async def test_product_info_names_the_currency_of_its_price(client, admin, new_product_id, settings):
    """Guards: a price shown without its currency (the waiting page printed a bare 12.50)."""
    pid = new_product_id()
    put = await client.put(f"/api/v1/admin/products/{pid}", json={"stock": 5, "price": 1250}, headers=admin)
    assert put.status_code == 200
    product = (await client.get(f"/api/v1/products/{pid}")).json()
    assert (product["price"], product["currency"]) == (1250, settings.payment.currency)
