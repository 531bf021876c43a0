"""Every state of the buyer's waiting page (docs/API.md, "The waiting page") in headless Chromium
against a real server and consumer, on a desktop and on a 390 px phone: before the opening (when
it opens), waiting (place and buyers ahead in one sentence), admitted, bought (and after a
reload, with its product), sold out, ended, a product without a room and a bad token. Each state
is checked for its words, for no stale figures, and for a card kept >= 12 px from the screen's
edges with nothing wider than the screen. Screenshots in
``$FLASHSALE_TEST_ARTIFACTS/flashsale-waiting-page/``.

The last test feeds the page ticket fields the room's answers gain with units held per turn
(``holds_unit``, ``admitted``, ``opens_at``, a place ``null`` until final): it takes each real
answer of the server and adds them on its way to the page, to check the page's side of that
contract."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from db.migrate import upgrade
from service.api.tokens import issue_token
from tests.integration.ops.test_ops_page import CHROMIUM, CHROMIUM_FLAGS
from tests.integration.waiting_page.test_waiting_page import SCREENSHOTS
from tests.support import flashsale_process
from toolkit.sale.isolation import free_port, isolated_settings, new_run_id
from toolkit.sale.stores import tear_down

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/ensure-tools installs)"),
]

VIEWPORTS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}
EDGE_PX = 12
PRICE = 1250  # minor units: CN¥12.50 in the test settings' currency
SETTLED = 'document.querySelector("#room").dataset.state !== "loading"'


@pytest.fixture
async def deployment(settings) -> AsyncIterator[tuple[Any, str, httpx.AsyncClient]]:
    """A server and consumer of the test's own whose rooms admit one buyer per unit left, in exact
    arrival order (an admission told at the join), for 60 s: ``(settings, base url, client)``."""
    own = isolated_settings(settings, new_run_id("wstates"))
    room = own.waiting_room.model_copy(
        update={"admit_factor": 1.0, "admission_ttl_seconds": 60, "arrival_window_ms": 0, "poll_max_ms": 1000}
    )
    own = own.model_copy(update={"waiting_room": room})
    await upgrade(own.db.url)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ready = f"{base}/api/v1/health/ready"
    try:
        async with (
            flashsale_process(own, ready, "serve", "--port", str(port), "--workers", "1"),
            flashsale_process(own, ready, "consume"),
            httpx.AsyncClient(base_url=base, trust_env=False, timeout=30) as http,
        ):
            yield own, base, http
    finally:
        await tear_down(own)


@pytest.fixture
async def browser():
    playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is in the test extras")
    async with playwright_api.async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


def clock(at: datetime) -> str:
    """What the page shows for ``at`` in the browser's time zone (UTC here): the time, and the
    day when it is not today."""
    time = at.strftime("%H:%M:%S")
    if at.date() == datetime.now(UTC).date():
        return time
    return f"{at:%a} {at.day} {at:%b}, {time}"


def when(at: datetime) -> str:
    """``at`` as the page says it in a sentence: "at 14:00:00", or "on Mon 7 Dec at 14:00:00"."""
    day, _, time = clock(at).rpartition(", ")
    return f"on {day} at {time}" if day else f"at {time}"


async def set_product(http: httpx.AsyncClient, admin: str, product: int, **fields: Any) -> None:
    body = {"stock": 1, "per_user_limit": 1, "price": PRICE, "stock_mode": "redis", "waiting_room": True, **fields}
    put = await http.put(f"/api/v1/admin/products/{product}", json=body, headers={"Authorization": f"Bearer {admin}"})
    assert put.status_code == 200, put.text


async def check_layout(page, viewport: dict[str, int]) -> None:
    """The card keeps EDGE_PX from both screen edges and nothing is wider than the screen."""
    box = await page.locator("#room").bounding_box()
    assert box is not None
    assert box["x"] >= EDGE_PX, box
    assert viewport["width"] - (box["x"] + box["width"]) >= EDGE_PX, box
    assert await page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]


async def figures(page) -> dict[str, str]:
    """The visible figure boxes, ``{name: value}`` ({} when the grid is hidden)."""
    if not await page.is_visible("#figures"):
        return {}
    names = await page.eval_on_selector_all("[data-figure]", "boxes => boxes.map(b => b.dataset.figure)")
    return {name: (await page.text_content(f'[data-figure="{name}"] .value') or "") for name in names}


async def words(page) -> dict[str, str]:
    return {
        part: " ".join((await page.text_content(f"#{part}") or "").split())
        for part in ("product-line", "headline", "lead", "warning", "note", "status")
    }


@pytest.mark.parametrize("device", list(VIEWPORTS))
async def test_each_state_of_the_page_reads_clearly_and_fits_the_screen(deployment, browser, device):
    own, base, http = deployment
    viewport = VIEWPORTS[device]
    admin = issue_token(own.auth.jwt_secret, "page-admin", admin=True)
    now = datetime.now(UTC).replace(microsecond=0)
    before, waiting, admitted, sold_out, ended, no_room = range(41, 47)
    opens = now + timedelta(hours=2)
    await set_product(http, admin, before, stock=3, sale_starts_at=opens.isoformat())
    await set_product(http, admin, waiting, stock=2)
    await set_product(http, admin, admitted, stock=1)
    await set_product(http, admin, sold_out, stock=1)
    ended_at = now - timedelta(hours=1)
    await set_product(
        http, admin, ended, sale_starts_at=(now - timedelta(hours=3)).isoformat(), sale_ends_at=ended_at.isoformat()
    )
    await set_product(http, admin, no_room, waiting_room=False)

    def bearer(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {issue_token(own.auth.jwt_secret, user)}"}

    async def join(product: int, user: str) -> dict[str, Any]:
        answer = await http.post(f"/api/v1/products/{product}/queue", headers=bearer(user))
        assert answer.status_code == 200, answer.text
        return answer.json()

    # waiting: two buyers let in for the two units, one waiting, then the page's buyer
    for user in ("first", "second"):
        assert (await join(waiting, user))["state"] == "admitted"
    assert (await join(waiting, "third"))["state"] == "waiting"
    # sold out: the one unit bought before the page opens
    admission = (await join(sold_out, "first"))["admission_token"]
    bought = await http.post(
        "/api/v1/orders",
        json={"product_id": sold_out, "quantity": 1},
        headers={**bearer("first"), "Admission-Token": admission},
    )
    assert bought.status_code == 202, bought.text

    context = await browser.new_context(viewport=viewport, timezone_id="UTC")
    elsewhere: list[str] = []
    joins: list[str] = []
    context.on("request", lambda r: None if r.url.startswith(base) else elsewhere.append(r.url))
    context.on("request", lambda r: joins.append(r.url) if r.url.endswith("/queue") else None)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    async def visit(product: int, state: str, user: str = "page-buyer", token: str | None = None, name: str = ""):
        token = token or issue_token(own.auth.jwt_secret, user)
        page = await context.new_page()
        await page.goto(f"{base}/queue/{product}#token={token}")
        await page.wait_for_selector(f'#room[data-state="{state}"]')
        await check_layout(page, viewport)
        await page.screenshot(path=SCREENSHOTS / f"{name or state}-{device}.png", full_page=True)
        return page

    # before the opening: when it opens, no place (it is drawn then)
    page = await visit(before, "before")
    shown = await words(page)
    assert shown["product-line"] == f"product {before} · CN¥12.50"
    assert shown["headline"] == f"The queue opens {when(opens)}"
    assert "drawn by lottery" in shown["lead"]
    assert set(await figures(page)) == {"opens-in", "units"}
    assert (await figures(page))["opens-in"].startswith(("1 h 59 min", "2 h 00 min"))
    assert (await figures(page))["units"] == "3"

    # waiting: place and buyers ahead in one sentence, never "place 4 / 1 ahead" alone
    page = await visit(waiting, "waiting")
    shown = await words(page)
    assert shown["lead"] == (
        "You are 4th in line. 1 buyer is still waiting ahead of you. The other 2 before you have already been let in."
    )
    assert await figures(page) == {"ahead": "1", "place": "4th", "estimate": "unknown", "units": "2"}
    # the 2 units are held for the 2 let in: with the 1 waiting ahead, none is left for this buyer
    assert shown["warning"] == (
        "2 buyers already let in and 1 buyer still waiting may buy before you, and 2 units are left: "
        "you may not get one."
    )

    # admitted, then bought; a reload keeps the order and the product
    page = await visit(admitted, "admitted")
    shown = await words(page)
    assert shown["headline"] == "It is your turn"
    # a turn keeps a unit (admit factor 1, the default): until when, and no warning
    assert shown["lead"].startswith("A unit is kept for you until ")
    assert shown["lead"].endswith(". Buy before then, or it goes to the next buyer.")
    assert not await page.is_visible("#warning")
    shown_figures = await figures(page)
    assert shown_figures["units"] == "1" and shown_figures["time-left"].endswith(" s")
    await page.click("#buy")
    await page.wait_for_selector('#room[data-state="bought"]')
    order_no = await page.text_content("#order")
    await page.reload()
    await page.wait_for_selector('#room[data-state="bought"]')
    await check_layout(page, viewport)
    await page.screenshot(path=SCREENSHOTS / f"bought-{device}.png", full_page=True)
    shown = await words(page)
    assert shown["product-line"] == f"product {admitted} · CN¥12.50"
    assert shown["lead"] == f"Your order number: {order_no}"
    assert await figures(page) == {}

    # sold out and ended: a sentence under the headline, no figures left over
    page = await visit(sold_out, "sold_out", user="page-late")
    shown = await words(page)
    assert (shown["headline"], shown["lead"]) == ("Sold out", "Every unit is sold.")
    assert await figures(page) == {}
    page = await visit(ended, "closed")
    shown = await words(page)
    assert shown["headline"] == "The sale has ended"
    assert shown["lead"] == f"No more units are sold in this sale; it ended {when(ended_at)}."
    assert await figures(page) == {}

    # a product without a room: a final word, no join, nothing retried
    joined = len(joins)
    page = await visit(no_room, "no_room")
    shown = await words(page)
    assert shown["headline"] == "No waiting room for this product"
    assert shown["lead"] == "This product sells without a waiting room: buy it directly from the shop."
    assert "Joining" not in await page.inner_text("#room") and ".;" not in " ".join(shown.values())
    assert len(joins) == joined

    # a token the shop did not sign
    forged = issue_token("another-secret-of-32-bytes-or-more!!", "page-buyer")
    page = await visit(waiting, "error", name="bad-token", token=forged)
    shown = await words(page)
    assert shown["headline"] == "Please sign in again"
    assert shown["status"] == ""  # final: nothing retried
    page = await visit(999, "error", name="no-product")
    shown = await words(page)
    assert (shown["headline"], shown["status"]) == ("No such product", "")
    assert elsewhere == []


def amend(fields: Callable[[dict[str, Any]], dict[str, Any]]):
    """A route handler that passes a queue call to the server and adds ``fields(ticket)`` to a
    ticket it answers."""

    async def handle(route):
        response = await route.fetch()
        body = await response.text()
        if response.status == 200:
            ticket = json.loads(body)
            body = json.dumps({**ticket, **fields(ticket)})
        await route.fulfill(response=response, body=body)

    return handle


@pytest.mark.parametrize("device", list(VIEWPORTS))
async def test_the_page_renders_units_held_per_turn_and_places_not_yet_final(deployment, browser, device):
    own, base, http = deployment
    viewport = VIEWPORTS[device]
    admin = issue_token(own.auth.jwt_secret, "page-admin", admin=True)
    kept, shared, settling, opening, crowded = range(51, 56)
    for product in (kept, shared, settling):
        await set_product(http, admin, product, stock=3)
    await set_product(http, admin, crowded, stock=2)
    for user in ("first", "second", "third"):  # two let in for the two units, one waiting
        join = await http.post(
            f"/api/v1/products/{crowded}/queue",
            headers={"Authorization": f"Bearer {issue_token(own.auth.jwt_secret, f'{user}-{device}')}"},
        )
        assert join.status_code == 200, join.text
    opens = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=30)
    await set_product(http, admin, opening, stock=3, sale_starts_at=(opens + timedelta(hours=1)).isoformat())
    context = await browser.new_context(viewport=viewport, timezone_id="UTC")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    async def visit(product: int, state: str, fields: Callable[[dict[str, Any]], dict[str, Any]], name: str):
        page = await context.new_page()
        await page.route(f"{base}/api/v1/products/{product}/queue**", amend(fields))
        await page.goto(f"{base}/queue/{product}#token={issue_token(own.auth.jwt_secret, 'page-buyer')}")
        await page.wait_for_selector(f'#room[data-state="{state}"]')
        await check_layout(page, viewport)
        await page.screenshot(path=SCREENSHOTS / f"{name}-{device}.png", full_page=True)
        return page

    # a turn that keeps a unit: until when, and no warning
    page = await visit(kept, "admitted", lambda t: {"holds_unit": True, "admitted": 1}, "admitted-unit-kept")
    shown = await words(page)
    expires = datetime.fromtimestamp(
        int(await page.evaluate("document.querySelector('[data-until]').dataset.until")) / 1000, UTC
    )
    assert shown["lead"] == (
        f"A unit is kept for you until {clock(expires)}. Buy before then, or it goes to the next buyer."
    )
    assert not await page.is_visible("#warning")
    assert set(await figures(page)) == {"time-left", "units"}

    # over-admission: more buyers let in than units left, said plainly
    page = await visit(
        shared, "admitted", lambda t: {"holds_unit": False, "admitted": t["units_left"] + 2}, "admitted-overadmitted"
    )
    shown = await words(page)
    assert shown["warning"] == "5 buyers are admitted for 3 units: you may not get one. The first to buy get them."
    assert (await figures(page))["admitted"] == "5"

    # waiting behind buyers let in whose turns keep no unit: they count as buying before you
    page = await visit(crowded, "waiting", lambda t: {"holds_unit": False, "admitted": 2}, "waiting-crowded")
    shown = await words(page)
    assert shown["lead"].startswith("You are 4th in line. 1 buyer is still waiting ahead of you.")
    assert shown["warning"] == (
        "2 buyers already let in and 1 buyer still waiting may buy before you, and 2 units are left: "
        "you may not get one."
    )

    # a place not final yet after the opening
    page = await visit(settling, "waiting", lambda t: {"state": "waiting", "position": None, "ahead": None}, "settling")
    shown = await words(page)
    assert shown["lead"].startswith("Your place is being settled")
    assert (await figures(page))["place"] == "settling…"

    # the ticket's opening wins over the product's
    page = await visit(opening, "before", lambda t: {"opens_at": int(opens.timestamp() * 1000)}, "before-opens-at")
    assert (await words(page))["headline"] == f"The queue opens {when(opens)}"


async def test_the_countdowns_follow_the_shop_clock_not_the_device(deployment, browser):
    """A device whose clock is an hour fast still shows the turn's whole time left and the
    shop's time it ends (from the answers' ``Date`` header), not a turn already run out."""
    own, base, http = deployment
    admin = issue_token(own.auth.jwt_secret, "page-admin", admin=True)
    product = 61
    await set_product(http, admin, product, stock=1)
    context = await browser.new_context(viewport=VIEWPORTS["desktop"], timezone_id="UTC")
    page = await context.new_page()
    await page.clock.set_system_time(datetime.now(UTC) + timedelta(hours=1))
    await page.goto(f"{base}/queue/{product}#token={issue_token(own.auth.jwt_secret, 'page-buyer')}")
    await page.wait_for_selector('#room[data-state="admitted"]')
    left = (await figures(page))["time-left"]
    # the 60 s turn, give or take the Date header's half second (an hour off would show "0 s")
    shown = re.fullmatch(r"(?:1 min 0([01])|(\d+)) s", left)
    assert shown and 30 <= (60 + int(shown[1]) if shown[1] else int(shown[2])) <= 61, left
    assert await page.is_enabled("#buy")
    expires = datetime.fromtimestamp(
        int(await page.evaluate("document.querySelector('[data-until]').dataset.until")) / 1000, UTC
    )
    assert (await words(page))["lead"] == (
        f"A unit is kept for you until {clock(expires)}. Buy before then, or it goes to the next buyer."
    )
