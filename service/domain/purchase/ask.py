"""A purchase request on its way through the stock-mode routes, and a route's "try again"
answer (:meth:`service.domain.purchase.service.PurchaseService.purchase` loops over them)."""

from __future__ import annotations

from dataclasses import dataclass

from db.models import StockMode
from service.domain.purchase.routes import Route
from service.domain.stock.buckets import bucket_of


@dataclass(frozen=True, slots=True)
class Ask:
    """One purchase request on its way through either stock mode."""

    user_id: str
    product_id: int
    quantity: int
    request_id: str
    order_token: str | None
    client: str  # the caller's address (per-address purchase rate)
    buckets: int = 1  # the product's stock buckets, as this process knows them
    admission: str | None = None  # the waiting room's Admission-Token

    @property
    def bucket(self) -> int:
        """The buyer's stock bucket (:func:`~service.domain.stock.buckets.bucket_of`)."""
        return bucket_of(self.user_id, self.buckets)


@dataclass(frozen=True, slots=True)
class Again:
    """A route's answer that is not the purchase's yet: try stock mode ``mode`` next, the other
    route (a move) or the same one once more; ``route``: the ``database`` route to use; ``ask``:
    the request as it goes on (when the product's bucket count was learned)."""

    mode: StockMode
    route: Route | None = None
    ask: Ask | None = None
