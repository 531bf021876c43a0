"""The ops page in headless Chromium (Debian's ``chromium``, driven by Playwright) during a small
sale: the numbers change without a reload, and a poisoned message shows as a dead letter."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from db.migrate import upgrade
from service.adapters.broker import declare_topology
from service.api.tokens import issue_token
from service.sale.isolation import environment, free_port, isolated_settings, new_run_id
from service.sale.stores import tear_down
from tests.support import api_ready, eventually, publish_raw, start_flashsale

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(os.environ.get("FLASHSALE_TEST_ARTIFACTS", "/tmp")) / "flashsale-ops-page"


@pytest.fixture
async def own_deployment(settings):
    """Settings of a deployment of the test's own (database, key prefix, queues), removed after."""
    own = isolated_settings(settings, new_run_id("ops"))
    await upgrade(own.db.url)
    try:
        yield own
    finally:
        await tear_down(own)


async def _number(page, element: str) -> float | None:
    value = (await page.text_content(f"#{element}") or "-").replace(",", "")
    return None if value == "-" else float(value)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/ensure-tools installs it)")
async def test_the_ops_page_follows_a_sale_and_shows_a_dead_letter(own_deployment, tmp_path):
    playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is in the test extras")
    own = own_deployment
    env = {**os.environ, **environment(own)}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    processes = [
        start_flashsale(["serve", "--port", str(port), "--workers", "1"], env, tmp_path / "api.log"),
        start_flashsale(["consume"], env, tmp_path / "consumer.log"),
    ]
    admin = issue_token(own.auth.jwt_secret, "ops-admin", admin=True)
    product = 77
    try:
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=30) as http:
            await eventually(lambda: api_ready(http), timeout=60, interval=0.25)
            put = await http.put(
                f"/api/v1/admin/products/{product}",
                json={"stock": 40, "per_user_limit": 1, "price": 100, "stock_mode": "redis"},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert put.status_code == 200, put.text

            async with playwright_api.async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
                try:
                    page = await browser.new_page(viewport={"width": 1100, "height": 900})
                    await page.goto(f"{base}/ops?token={admin}")
                    row = f'tr[data-product="{product}"]'
                    await page.wait_for_selector(f"{row} td.redis-stock")
                    assert await page.text_content(f"{row} td.redis-stock") == "40"
                    assert await _number(page, "dead-letters") == 0

                    async def buy(user: int) -> int:
                        token = issue_token(own.auth.jwt_secret, f"buyer-{user}")
                        answer = await http.post(
                            "/api/v1/orders",
                            json={"product_id": product, "quantity": 1},
                            headers={"Authorization": f"Bearer {token}"},
                        )
                        return answer.status_code

                    statuses = await asyncio.gather(*(buy(user) for user in range(60)))
                    assert statuses.count(202) == 40 and statuses.count(409) == 20
                    # the page catches up by itself (no reload): stock, sold and the purchase totals
                    await page.wait_for_function(
                        f"document.querySelector('{row} td.sold').textContent === '40'", timeout=30_000
                    )
                    assert await page.text_content(f"{row} td.redis-stock") == "0"
                    assert await page.text_content(f"{row} td.drift") == "0"
                    await page.wait_for_function(
                        "document.getElementById('accepted-total').textContent === '40'", timeout=30_000
                    )
                    assert await _number(page, "rejected-total") == 20
                    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                    await page.screenshot(path=SCREENSHOTS / "sale.png", full_page=True)

                    # a poison message: the consumer dead-letters it, the page shows it
                    import aio_pika

                    connection = await aio_pika.connect(own.amqp.url)
                    try:
                        channel = await connection.channel()
                        await declare_topology(channel, own.amqp)
                        await publish_raw(channel, own, b"\x00poison", message_id="poison")
                    finally:
                        await connection.close()
                    await page.wait_for_function(
                        "document.getElementById('dead-letters').textContent === '1'", timeout=30_000
                    )
                    assert "alert" in (await page.get_attribute("#dead-letters-tile", "class") or "")
                    shot = SCREENSHOTS / "dead-letter.png"
                    await page.screenshot(path=shot, full_page=True)
                    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000
                finally:
                    await browser.close()
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            await asyncio.to_thread(process.wait, 30)
