"""The live ops page: ``GET /ops`` (HTML, no asset from elsewhere) and the JSON it polls,
``GET /api/v1/admin/ops`` (admin).

A browser cannot put a bearer token on a page it navigates to, so the operator opens
``/ops#token=<admin JWT>``: the fragment never leaves the browser (no query string in an access
log, a proxy's log or the server's), and the page's script sends the token as a bearer header to
the JSON routes. The page itself holds no data, so it is served to anyone; a missing, refused or
expired token is the page's own "stale" banner, which says how to get one.
"""

from __future__ import annotations

import asyncio
import time
from importlib.resources import files

import msgspec
from litestar import Controller, MediaType, Response, get
from litestar.di import NamedDependency

from service.adapters.broker import Publisher
from service.api.auth import admin_only
from service.api.ops_history import SAMPLE_SECONDS, PurchaseCounts, PurchaseHistory, purchase_totals, split
from service.domain.stock.catalog import CatalogService, ProductTerms
from service.domain.stock.realign import Realigner
from service.domain.stock.realign_report import RealignReport
from service.settings import Settings

TOKEN_COMMAND = "flashsale token --user ops --admin --ttl 28800"
"""How an operator gets the page's token (8 hours: a shift); the page and its 401s say it."""
_PAGE = (
    files("service.api.static").joinpath("ops.html").read_text().replace("{{token_command}}", TOKEN_COMMAND).encode()
)


class OpsProduct(msgspec.Struct):
    """One product on the ops page: ``terms`` (name, stock mode, sale window, buckets, ...) and
    ``stock`` (a dry-run realignment: Redis and MySQL stock, sold, in flight, drift; units). A
    new per-product section of the page is one more field here and one more entry of the page's
    ``PRODUCT_SECTIONS``."""

    terms: ProductTerms
    stock: RealignReport


class OpsView(msgspec.Struct):
    """What the ops page shows, now. ``order_queue`` / ``dead_letters``: messages ready (None
    when the broker could not be asked). With metrics on (else None and ``[]``): ``purchases``,
    the purchase answers so far by code, every API worker of this server summed; ``answers``, the
    same split as the page shows them; ``history``, this worker's ring of ``answers`` every
    ``history_every`` seconds, oldest first (:mod:`service.api.ops_history`): the page turns them
    into rates."""

    products: list[OpsProduct]
    order_queue: int | None
    dead_letters: int | None
    purchases: dict[str, int] | None
    answers: PurchaseCounts | None
    history: list[PurchaseCounts]
    history_every: float


async def _queue_depths(publisher: Publisher) -> tuple[int | None, int | None]:
    try:
        return await publisher.queue_depths()
    except Exception:  # the page shows "-" for a broker it cannot ask; the health probe says why
        return None, None


async def _products(catalog: CatalogService, realigner: Realigner) -> list[OpsProduct]:
    """Every product with its terms and its stock report (a product created between the two
    reads waits for the next poll)."""
    terms = {product.id: product for product in await catalog.terms()}
    reports = await realigner.realign_all(dry_run=True)
    return [OpsProduct(terms[report.product_id], report) for report in reports if report.product_id in terms]


class OpsController(Controller):
    tags = ["operations"]

    @get("/ops", exclude_from_auth=True, include_in_schema=False, media_type="text/html")
    async def page(self) -> Response[bytes]:
        """The ops page; it reads the admin token from its own URL's fragment (``#token=``)."""
        return Response(_PAGE, media_type=MediaType.HTML, headers={"Cache-Control": "no-store"})

    @get("/api/v1/admin/ops", guards=[admin_only], summary="What the ops page shows (polled)")
    async def view(
        self,
        catalog: NamedDependency[CatalogService],
        realigner: NamedDependency[Realigner],
        publisher: NamedDependency[Publisher],
        settings: NamedDependency[Settings],
        purchase_history: NamedDependency[PurchaseHistory],
    ) -> OpsView:
        """Every product's terms and stock report (dry run), queue depths, purchase answers so far
        and their recent history."""
        products, (order_queue, dead_letters) = await asyncio.gather(
            _products(catalog, realigner), _queue_depths(publisher)
        )
        purchases, answers = None, None
        if settings.metrics.enabled:
            totals = await purchase_totals()
            purchases, answers = {code: int(n) for code, n in totals.items()}, split(totals, time.time())
        return OpsView(
            products, order_queue, dead_letters, purchases, answers, purchase_history.samples(), SAMPLE_SECONDS
        )
