"""``GET /queue/{id}`` serves the waiting page without a token, labelled HTML with one charset, and with
the headers that keep its token and script its own (docs/API.md, "The waiting page"); what the
page does in a browser is tests/integration/waiting_page."""

from __future__ import annotations


async def test_the_page_is_html_with_one_charset_and_its_own_origin_only(client, product_id):
    page = await client.get(f"/queue/{product_id}")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["referrer-policy"] == "no-referrer" and page.headers["cache-control"] == "no-store"
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "<script>" in page.text and "https://" not in page.text
