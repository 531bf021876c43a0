"""The buyer's waiting page (``GET /queue/{id}``, docs/API.md, "The waiting page") in headless
Chromium (Debian's ``chromium``, driven by Playwright) against a real server and consumer: one
page goes from waiting to admitted (the buyer ahead lets its admission lapse) to bought, another
from waiting to sold out (the buyer ahead buys the last unit) and, when that order is cancelled,
to admitted again; then the ops page's waiting-room section shows both rooms. Screenshots in
``$FLASHSALE_TEST_ARTIFACTS/flashsale-waiting-page/``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from db.migrate import upgrade
from service.api.tokens import issue_token
from tests.integration.ops.test_ops_page import CHROMIUM, CHROMIUM_FLAGS
from tests.support import eventually, flashsale_process
from toolkit.sale.isolation import free_port, isolated_settings, new_run_id
from toolkit.sale.stores import tear_down

pytestmark = pytest.mark.slow

SCREENSHOTS = Path(os.environ.get("FLASHSALE_TEST_ARTIFACTS", "/tmp")) / "flashsale-waiting-page"
ADMISSION_SECONDS = 5  # the setting's smallest value: the lapsed admission passes on soon
PAGE_WAIT_MS = 30_000


@pytest.fixture
async def own_deployment(settings):
    """A deployment of the test's own whose waiting rooms admit one buyer per unit left, for 5 s,
    and tell buyers to poll every 0.2-0.5 s."""
    own = isolated_settings(settings, new_run_id("wpage"))
    room = own.waiting_room.model_copy(
        update={"admit_factor": 1.0, "admission_ttl_seconds": ADMISSION_SECONDS, "poll_min_ms": 200, "poll_max_ms": 500}
    )
    own = own.model_copy(update={"waiting_room": room})
    await upgrade(own.db.url)
    try:
        yield own
    finally:
        await tear_down(own)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/ensure-tools installs it)")
async def test_the_waiting_page_goes_from_waiting_to_bought_and_to_sold_out(own_deployment):
    playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is in the test extras")
    own = own_deployment
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ready = f"{base}/api/v1/health/ready"
    admin = issue_token(own.auth.jwt_secret, "page-admin", admin=True)

    def bearer(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {issue_token(own.auth.jwt_secret, user)}"}

    lapsing, bought_out = 31, 32  # the first buyer of 31 lets its turn lapse; of 32 it buys the last unit
    async with (
        flashsale_process(own, ready, "serve", "--port", str(port), "--workers", "1"),
        flashsale_process(own, ready, "consume"),
        httpx.AsyncClient(base_url=base, trust_env=False, timeout=30) as http,
    ):
        for product in (lapsing, bought_out):
            put = await http.put(
                f"/api/v1/admin/products/{product}",
                json={"stock": 1, "per_user_limit": 1, "price": 1250, "stock_mode": "redis", "waiting_room": True},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert put.status_code == 200, put.text

        async def admit_ahead(product: int) -> str:
            """Someone ahead of the page's buyer, admitted for the one unit: their admission token."""
            ahead = await http.post(f"/api/v1/products/{product}/queue", headers=bearer("ahead"))
            assert ahead.status_code == 200 and ahead.json()["state"] == "admitted", ahead.text
            return ahead.json()["admission_token"]

        async with playwright_api.async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            elsewhere: list[str] = []
            try:
                context = await browser.new_context(viewport={"width": 800, "height": 900})
                context.on("request", lambda r: None if r.url.startswith(base) else elsewhere.append(r.url))
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)

                # waiting -> admitted -> bought
                await admit_ahead(lapsing)
                token = issue_token(own.auth.jwt_secret, "page-buyer")
                page = await context.new_page()
                await page.goto(f"{base}/queue/{lapsing}#token={token}")
                await page.wait_for_selector('#room[data-state="waiting"]')
                assert "#token" not in page.url and token not in page.url  # out of the address bar
                assert await page.text_content("#lead") == (  # the buyer ahead holds place 1, admitted
                    "You are 2nd in line. Nobody is waiting ahead of you: you are next. "
                    "The 1 buyer before you has already been let in."
                )
                assert await page.text_content('[data-figure="units"] .value') == "1"
                assert (await page.text_content("#product-line") or "").endswith("CN¥12.50")
                await page.screenshot(path=SCREENSHOTS / "waiting.png", full_page=True)
                # the buyer ahead never buys: its admission lapses and the page's buyer is next
                await page.wait_for_selector('#room[data-state="admitted"]', timeout=PAGE_WAIT_MS)
                assert await page.is_visible("#buy")
                assert re.fullmatch(r"\d+ s", await page.text_content('[data-figure="time-left"] .value') or "")
                await page.screenshot(path=SCREENSHOTS / "admitted.png", full_page=True)
                await page.click("#buy")
                await page.wait_for_selector('#room[data-state="bought"]', timeout=PAGE_WAIT_MS)
                order_no = await page.text_content("#order") or ""
                assert re.fullmatch(r"[A-Z]{2}\d{24}", order_no), order_no
                order = await http.get(f"/api/v1/orders/{order_no}", headers={"Authorization": f"Bearer {token}"})
                assert order.status_code == 200 and order.json()["product_id"] == lapsing
                await page.screenshot(path=SCREENSHOTS / "bought.png", full_page=True)
                # a reload shows the order, never a second purchase
                await page.reload()
                await page.wait_for_selector('#room[data-state="bought"]')
                assert await page.text_content("#order") == order_no

                # waiting -> sold out
                admission = await admit_ahead(bought_out)
                other = await context.new_page()
                await other.goto(f"{base}/queue/{bought_out}#token={issue_token(own.auth.jwt_secret, 'page-late')}")
                await other.wait_for_selector('#room[data-state="waiting"]')
                assert await other.text_content('[data-figure="estimate"] .value') in ("any moment", "unknown")
                bought = await http.post(
                    "/api/v1/orders",
                    json={"product_id": bought_out, "quantity": 1},
                    headers={**bearer("ahead"), "Admission-Token": admission},
                )
                assert bought.status_code == 202, bought.text
                await other.wait_for_selector('#room[data-state="sold_out"]', timeout=PAGE_WAIT_MS)
                assert await other.text_content("#headline") == "Sold out"
                assert await other.is_hidden("#buy")
                await other.screenshot(path=SCREENSHOTS / "sold-out.png", full_page=True)
                # the buyer ahead cancels: the unit comes back and the sold-out page, still
                # watching, gets its turn
                order_no = bought.json()["order_no"]

                async def cancelled() -> bool:
                    answer = await http.post(f"/api/v1/orders/{order_no}/cancel", headers=bearer("ahead"))
                    return answer.status_code == 200

                await eventually(cancelled, interval=0.2)
                await other.wait_for_selector('#room[data-state="admitted"]', timeout=PAGE_WAIT_MS)

                # the ops page's waiting-room section: both rooms, admissions and the lapsed token
                ops = await context.new_page()
                await ops.goto(f"{base}/ops#token={admin}")
                room = f'tr[data-room="{lapsing}"]'
                await ops.wait_for_function(
                    f"(document.querySelector('{room} td.admitted') || {{}}).textContent === '2'",
                    timeout=PAGE_WAIT_MS,
                )
                assert await ops.text_content(f"{room} td.expired") == "1"
                assert (
                    await ops.text_content(f'tr[data-room="{bought_out}"] td.admitted') == "2"
                )  # ahead, then the page
                assert await ops.text_content(f"{room} td.wait-p50") != "-"
                # its one unit is sold: no figure of tokens outstanding the last poll happened to see
                await ops.wait_for_function(
                    f"(document.querySelector('{room} td.outstanding') || {{}}).textContent === '- (sold out)'",
                    timeout=PAGE_WAIT_MS,
                )
                await ops.screenshot(path=SCREENSHOTS / "ops-waiting-rooms.png", full_page=True)
                assert elsewhere == []  # nothing loaded from another origin
            finally:
                await browser.close()
