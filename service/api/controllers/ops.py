"""The live ops page: ``GET /ops`` (admin; HTML, no asset from elsewhere) and the JSON it polls,
``GET /api/v1/admin/ops``.

A browser cannot put a bearer token on a page it navigates to, so ``/ops`` takes the admin JWT
from ``?token=`` (or the ``Authorization`` header) and checks it itself; its script sends the
same token as a bearer header to the JSON route. The access log records paths without the query
string.
"""

from __future__ import annotations

import asyncio
from importlib.resources import files
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.params import QueryParameter

from service import metrics
from service.adapters.broker import Publisher
from service.api.auth import admin_only, decode_admin
from service.domain.stock.realign import Realigner
from service.domain.stock.realign_report import RealignReport
from service.settings import Settings

_PAGE = files("service.api.static").joinpath("ops.html").read_bytes()


class OpsView(msgspec.Struct):
    """What the ops page shows, now. ``products``: a dry-run realignment per product (Redis and
    MySQL stock, sold, in flight, drift; units). ``order_queue`` / ``dead_letters``: messages
    ready (None when the broker could not be asked). ``purchases``: purchase answers so far by
    code, every API worker summed (None with metrics off); the page turns them into rates."""

    products: list[RealignReport]
    order_queue: int | None
    dead_letters: int | None
    purchases: dict[str, float] | None


async def _queue_depths(publisher: Publisher) -> tuple[int | None, int | None]:
    try:
        return await publisher.queue_depths()
    except Exception:  # the page shows "-" for a broker it cannot ask; the health probe says why
        return None, None


async def _purchases(settings: Settings) -> dict[str, float] | None:
    if not settings.metrics.enabled:
        return None
    metrics.flush()
    return await asyncio.to_thread(metrics.purchase_totals)


class OpsController(Controller):
    tags = ["operations"]

    @get("/ops", exclude_from_auth=True, include_in_schema=False, media_type="text/html")
    async def page(
        self,
        request: Request[Any, Any, Any],
        settings: NamedDependency[Settings],
        token: Annotated[str | None, QueryParameter(required=False)] = None,
    ) -> Response[bytes]:
        """The ops page (admin: ``?token=<admin JWT>`` or a bearer header); 401 / 403 otherwise."""
        header = request.headers.get("authorization", "")
        encoded = token or (header[7:] if header.lower().startswith("bearer ") else None)
        if encoded is None:
            raise NotAuthorizedException("An admin token is required: /ops?token=<JWT>")
        if not decode_admin(settings.auth.jwt_secret, encoded):
            raise PermissionDeniedException("Admin role required")
        return Response(_PAGE, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-store"})

    @get("/api/v1/admin/ops", guards=[admin_only], summary="What the ops page shows (polled)")
    async def view(
        self,
        realigner: NamedDependency[Realigner],
        publisher: NamedDependency[Publisher],
        settings: NamedDependency[Settings],
    ) -> OpsView:
        """Every product's stock report (dry run), queue depths and purchase answers so far."""
        products = await realigner.realign_all(dry_run=True)
        (order_queue, dead_letters), purchases = await asyncio.gather(_queue_depths(publisher), _purchases(settings))
        return OpsView(products, order_queue, dead_letters, purchases)
