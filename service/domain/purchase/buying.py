"""A purchase on its way through the stock modes, a mode's answer that it is not done yet
(:meth:`service.domain.purchase.service.PurchaseService.purchase` loops over them), and the
candidate order number both modes start with."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from db.models import StockMode
from service.domain.order_numbers.minter import OrderNumberMinter, ShardLost
from service.domain.order_numbers.mysql_minter import MysqlOrderNumberMinter
from service.domain.purchase.answers import Down, rejected
from service.domain.purchase.product_modes import ProductMode
from service.domain.stock.buckets import bucket_of
from service.failures import StoreFailure
from service.model.stock import ReserveRequest

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Purchase:
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

    def reserve_request(self, order_no: str, attempt: str) -> ReserveRequest:
        """The Redis reserve call of this purchase, with candidate ``order_no`` and the HTTP
        attempt's token ``attempt``."""
        return ReserveRequest(
            self.product_id,
            self.request_id,
            self.user_id,
            self.quantity,
            order_no,
            attempt,
            self.order_token,
            self.client,
            bucket=self.bucket,
            buckets=self.buckets,
            admission=self.admission,
        )


@dataclass(frozen=True, slots=True)
class TryNext:
    """A stock mode's answer that is not the purchase's yet: try ``stock_mode`` next, the other
    mode (a move) or the same one once more; ``product_mode``: what MySQL said of the product
    (the ``database`` mode needs it); ``purchase``: the request as it goes on (when the
    product's bucket count was learned)."""

    stock_mode: StockMode
    product_mode: ProductMode | None = None
    purchase: Purchase | None = None


async def candidate_order_no(minter: OrderNumberMinter | MysqlOrderNumberMinter, down: Down) -> str:
    """A candidate order number from ``minter``; a minter that cannot give one (its store
    failed, or its shard lease was lost) answers ``unavailable`` for ``down``, logged."""
    try:
        return await minter.take()
    except (StoreFailure, ShardLost) as exc:
        log.warning("order_no_unavailable", error=repr(exc))
        raise rejected(down) from exc
