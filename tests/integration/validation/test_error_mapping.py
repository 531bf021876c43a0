"""Domain errors become problem details in one place; anything else is a logged 500, never a 404."""

from __future__ import annotations

import structlog

import service.api.problems as problems
import service.domain.stock.realign as realign_module


async def test_a_key_error_inside_a_realignment_pass_is_a_500_not_a_404(
    client, admin, put_product, product_id, monkeypatch
):
    await put_product(product_id, stock=5)

    def broken(*args: object) -> None:
        raise KeyError("a bug inside the pass")

    monkeypatch.setattr(realign_module, "sale_terms", broken)
    # A fresh logger: the module's own caches its processors on first use (configure_logging), so
    # once an earlier test made it log, capture_logs would no longer see it.
    monkeypatch.setattr(problems, "log", structlog.get_logger(problems.__name__))
    with structlog.testing.capture_logs() as logs:
        stock = await client.get(f"/api/v1/admin/products/{product_id}/stock", headers=admin)
        one_pass = await client.post(f"/api/v1/admin/realign?product_id={product_id}", headers=admin)
    for response in (stock, one_pass):
        assert response.status_code == 500, response.text
        assert response.json()["code"] == "internal_error"
    assert [entry["event"] for entry in logs].count("unhandled_error") == 2


async def test_an_unknown_product_is_still_a_404(client, admin, new_product_id):
    response = await client.get(f"/api/v1/admin/products/{new_product_id()}/stock", headers=admin)
    assert response.status_code == 404
    assert response.json()["code"] == "product_not_found"
