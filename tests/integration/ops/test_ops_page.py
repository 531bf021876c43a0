"""The ops page in headless Chromium (Debian's ``chromium``, driven by Playwright) against a
``flashsale serve`` of two workers: real purchases answered accepted, sold out, limit exceeded,
rate limited and product not found show split on the page; the products show their terms; the
chart has a time axis and the server's history as soon as the page opens; the numbers follow a
sale without a reload; a poisoned message shows as a dead letter; and a page whose admin token
expires, or that was opened with a bad token, none or one in the query string, says it is
stale and how to get a token; the page asks for nothing that answers 404 (a favicon)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from db.migrate import upgrade
from service.adapters.broker_topology import declare_topology
from service.api.controllers.ops import TOKEN_COMMAND
from service.api.ops_history import SAMPLE_SECONDS
from service.api.tokens import issue_token
from tests.support import api_ready, eventually, publish_raw, start_flashsale
from toolkit.sale.isolation import environment, free_port, isolated_settings, new_run_id
from toolkit.sale.stores import tear_down

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
# Per user and product: 2 requests at once, then one per 100 s (nothing refills during the test),
# so a buyer's second request is answered limit_exceeded and the third too_many_requests.
RATE_LIMITS = {"FLASHSALE_RATE_LIMIT__USER_BURST": "2", "FLASHSALE_RATE_LIMIT__USER_PER_SECOND": "0.01"}
KETTLE, TEAPOT = 77, 78


@pytest.fixture
async def own_deployment(settings):
    """Settings of a deployment of the test's own (database, key prefix, queues), removed after."""
    own = isolated_settings(settings, new_run_id("ops"))
    await upgrade(own.db.url)
    try:
        yield own
    finally:
        await tear_down(own)


@pytest.fixture
async def browser():
    playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is in the test extras")
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (scripts/ensure-tools installs it)")
    async with playwright_api.async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def serving(own_deployment, tmp_path):
    """``(http, own)``: ``flashsale serve --workers 2`` (with :data:`RATE_LIMITS`) and ``consume``
    on the test's own deployment, and an httpx client for the API."""
    own = own_deployment
    env = {**os.environ, **environment(own), **RATE_LIMITS}
    port = free_port()
    processes = [
        start_flashsale(["serve", "--port", str(port), "--workers", "2"], env, tmp_path / "api.log"),
        start_flashsale(["consume"], env, tmp_path / "consumer.log"),
    ]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http:
            await eventually(lambda: api_ready(http), timeout=60, interval=0.25)
            yield http, own
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            await asyncio.to_thread(process.wait, 30)


async def _number(page, element: str) -> float | None:
    value = (await page.text_content(f"#{element}") or "-").replace(",", "")
    return None if value == "-" else float(value)


async def _cell(page, product: int, column: str) -> str | None:
    return await page.text_content(f'tr[data-product="{product}"] td.{column}')


async def test_the_ops_page_splits_answers_shows_history_and_follows_a_sale(serving, browser):
    http, own = serving
    admin = issue_token(own.auth.jwt_secret, "ops-admin", admin=True)
    products = {
        KETTLE: {"name": "Flash kettle", "stock": 40, "stock_mode": "redis", "sale_ends_at": "2099-01-01T00:00:00Z"},
        TEAPOT: {"name": "Slow teapot", "stock": 5, "stock_mode": "database"},
    }
    for product, body in products.items():
        put = await http.put(
            f"/api/v1/admin/products/{product}",
            json={"per_user_limit": 1, "price": 100, **body},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert put.status_code == 200, put.text

    async def buy(user: str, product: int = KETTLE) -> str:
        answer = await http.post(
            "/api/v1/orders",
            json={"product_id": product, "quantity": 1},
            headers={"Authorization": f"Bearer {issue_token(own.auth.jwt_secret, user)}"},
        )
        return "accepted" if answer.status_code in (201, 202) else answer.json()["code"]  # 201: database mode

    async def wave(users: list[str], product: int = KETTLE) -> list[str]:
        return await asyncio.gather(*(buy(user, product) for user in users))

    early = [f"early-{n}" for n in range(10)]
    assert await wave(early) == ["accepted"] * 10
    assert await wave(early) == ["limit_exceeded"] * 10  # the per-user limit of 1
    assert await wave(early) == ["too_many_requests"] * 10  # the third request within the burst of 2
    late = await wave([f"late-{n}" for n in range(50)])
    assert late.count("accepted") == 30 and late.count("sold_out") == 20
    assert await wave(["nobody"] * 3, product=999_999) == ["product_not_found"] * 3
    # Every worker's ring of samples holds these totals once each has sampled after them (the
    # local sums reach the shared files within a second).
    await asyncio.sleep(SAMPLE_SECONDS + 2)

    page = await browser.new_page(viewport={"width": 1200, "height": 1000})
    opened = time.time()
    await page.goto(f"{http.base_url}/ops#token={admin}")
    # the first poll's answer: the chart already has the server's history
    await page.wait_for_function("Number(document.getElementById('rates').dataset.points) > 0", timeout=30_000)
    # the purchases are on the chart at the times the server sampled them, before the page opened
    drawn = await page.evaluate("drawn")
    assert any(point["accepted"] > 0 and point["at"] < opened for point in drawn), drawn
    assert any(point["too_many_requests"] > 0 and point["at"] < opened for point in drawn), drawn
    ticks = await page.eval_on_selector_all("#rates text.time-tick", "ticks => ticks.map(t => t.textContent)")
    assert ticks and all(re.fullmatch(r"\d\d:\d\d", tick) for tick in ticks), ticks
    accepted = await page.get_attribute("#rates polyline[data-series=accepted]", "points") or ""
    heights = {float(point.split(",")[1]) for point in accepted.split()}
    assert len(heights) > 1  # drawn: the line leaves the zero line

    expected = {"accepted": 40, "sold_out": 20, "limit_exceeded": 10, "too_many_requests": 10, "unavailable": 0}
    for key, count in {**expected, "other": 3}.items():
        assert await _number(page, f"total-{key}") == count, key
    assert "product_not_found: 3" in (await page.get_attribute("#total-other", "title") or "")

    assert await _cell(page, KETTLE, "name") == "Flash kettle"
    assert await _cell(page, KETTLE, "stock-mode") == "redis"
    assert await _cell(page, KETTLE, "buckets") == "1"
    kettle_window = await _cell(page, KETTLE, "sale-window") or ""
    # its sale is open, its 40 units are sold: it does not read "(open)"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d → 2099-01-01 00:00 \(sold out\)", kettle_window), kettle_window
    assert await _cell(page, TEAPOT, "stock-mode") == "database"
    # MySQL sells the teapot: Redis's copy of its stock is not shown
    assert (await _cell(page, TEAPOT, "redis-stock"), await _cell(page, TEAPOT, "drift")) == ("-", "-")
    assert (await _cell(page, TEAPOT, "sale-window") or "").endswith("→ no end (open)")
    await page.wait_for_function(
        f"document.querySelector('tr[data-product=\"{KETTLE}\"] td.sold').textContent === '40'", timeout=30_000
    )
    assert await _cell(page, KETTLE, "redis-stock") == "0"
    assert await _cell(page, KETTLE, "drift") == "0"
    assert await _number(page, "dead-letters") == 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "sale.png", full_page=True)

    # the page catches up by itself (no reload): one more buyer of the teapot
    assert await wave(["teapot-buyer"], product=TEAPOT) == ["accepted"]
    await page.wait_for_function("document.getElementById('total-accepted').textContent === '41'", timeout=30_000)
    await page.wait_for_function(
        f"document.querySelector('tr[data-product=\"{TEAPOT}\"] td.sold').textContent === '1'", timeout=30_000
    )

    # a poison message: the consumer dead-letters it, the page shows it
    import aio_pika

    connection = await aio_pika.connect(own.amqp.url)
    try:
        channel = await connection.channel()
        await declare_topology(channel, own.amqp)
        await publish_raw(channel, own, b"\x00poison", message_id="poison")
    finally:
        await connection.close()
    await page.wait_for_function("document.getElementById('dead-letters').textContent === '1'", timeout=30_000)
    assert "alert" in (await page.get_attribute("#dead-letters-tile", "class") or "")
    assert not await page.is_visible("#stale")
    shot = SCREENSHOTS / "dead-letter.png"
    await page.screenshot(path=shot, full_page=True)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000


async def test_a_page_whose_token_expires_says_it_is_stale_and_how_to_get_a_token(serving, browser):
    http, own = serving
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    short = issue_token(own.auth.jwt_secret, "ops-admin", admin=True, ttl_seconds=3)
    await page.goto(f"{http.base_url}/ops#token={short}")
    await page.wait_for_function("document.getElementById('status').textContent.startsWith('updated')")
    assert not await page.is_visible("#stale")
    # the API accepts a token up to the clock-skew leeway past its expiry; then the polls get 401
    await page.wait_for_selector("#stale", state="visible", timeout=30_000)
    banner = await page.text_content("#stale") or ""
    assert banner.startswith("Stale:") and "expired at" in banner and "(HTTP 401)" in banner, banner
    assert TOKEN_COMMAND in banner and "--ttl" in banner and "/ops#token=<the token>" in banner
    assert "stale" in (await page.get_attribute("body", "class") or "")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "stale.png", full_page=True)


async def test_a_bad_missing_or_misplaced_token_is_the_pages_own_stale_banner(serving, browser):
    """The first open with a refused token shows the page, stale, not a problem+json body; a
    token in the query string is not used and leaves the address bar; nothing answers 404."""
    http, own = serving
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    missing: list[str] = []
    page.on("response", lambda response: missing.append(response.url) if response.status == 404 else None)
    forged = issue_token("another-secret-of-32-characters-or-more", "ops-admin", admin=True)
    cases = {
        f"/ops#token={forged}": ("The server refused the admin token", "(HTTP 401)"),
        "/ops": ("opened without an admin token", "(HTTP 401)"),
        f"/ops?token={issue_token(own.auth.jwt_secret, 'ops-admin', admin=True)}": ("goes after #, not ?", ""),
    }
    for path, (why, status) in cases.items():
        await page.goto(f"{http.base_url}{path}")
        await page.wait_for_selector("#stale", state="visible", timeout=30_000)
        banner = await page.text_content("#stale") or ""
        assert banner.startswith("Stale:") and why in banner and status in banner, (path, banner)
        assert TOKEN_COMMAND in banner and "/ops#token=<the token>" in banner, banner
        assert await page.text_content("h1") == "flashsale: live operations"
        assert "?token=" not in page.url, page.url  # a query-string token is taken off the address bar
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "refused.png", full_page=True)
    assert missing == []
