"""What a purchase answers: the accepted order, or a rejection from one table shared by both
stock modes (docs/API.md has the codes)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from service.domain.errors import DomainError, InvalidInput
from service.domain.purchase.sold_out import FlagAnswer
from service.failures import UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, unavailable_detail
from service.model.stock import ReserveOutcome


@dataclass(frozen=True, slots=True)
class Accepted:
    """A purchase the broker has confirmed (or a replay of one). ``quantity`` in units.
    ``status``: None for an order queued for MySQL (stock mode ``redis``), else the status label
    of the order MySQL already holds (``database`` mode: ``pending_payment`` when new)."""

    order_no: str
    request_id: str
    product_id: int
    quantity: int
    status: str | None = None


class PurchaseRejected(DomainError):
    """The purchase was not taken; nothing stays reserved. ``code`` is the stable error code of
    the HTTP contract: ``sold_out``, ``limit_exceeded``, ``sale_not_active``,
    ``request_in_progress``, ``idempotency_key_reused``, ``too_many_requests`` (the purchase rate
    of the user or the client address is spent; ``retry_after`` seconds) or ``unavailable``
    (Redis/RabbitMQ failure, or the stock is not loaded yet; ``retry_after`` seconds)."""

    def __init__(self, code: str, detail: str, retry_after: int | None = None) -> None:
        default = UNAVAILABLE_RETRY_AFTER if code == UNAVAILABLE else None
        super().__init__(detail, code=code, retry_after=retry_after or default)


class Down(Enum):
    """Why a purchase answers ``unavailable`` when no reserve outcome says it: which store failed
    (or that the buyer's bucket is being refilled)."""

    STOCK = "stock"
    DATABASE = "database"
    QUEUE = "queue"
    TOKENS = "tokens"
    REBALANCING = "rebalancing"


REJECTIONS: dict[ReserveOutcome | Down, tuple[str, str]] = {
    ReserveOutcome.SOLD_OUT: ("sold_out", "No stock left for this product."),
    ReserveOutcome.LIMIT_EXCEEDED: ("limit_exceeded", "This purchase would take you past the per-user limit."),
    ReserveOutcome.SALE_NOT_ACTIVE: ("sale_not_active", "The sale for this product is not open."),
    ReserveOutcome.IN_FLIGHT: ("request_in_progress", "A request with this Idempotency-Key is still being processed."),
    ReserveOutcome.KEY_REUSED: (
        "idempotency_key_reused",
        "This Idempotency-Key was used with a different request body.",
    ),
    ReserveOutcome.RATE_LIMITED: ("too_many_requests", "Too many purchase requests; retry later."),
    ReserveOutcome.NOT_LOADED: (UNAVAILABLE, "Stock is not loaded yet, retry shortly."),
    ReserveOutcome.TOKEN_REQUIRED: ("token_required", "This product needs an Order-Token header."),
    ReserveOutcome.TOKEN_INVALID: ("token_invalid", "The Order-Token is unknown, expired or not yours."),
    ReserveOutcome.ADMISSION_REQUIRED: (
        "admission_required",
        "This product sells through its waiting room: join its queue and buy with the Admission-Token it gives you.",
    ),
    # Both sides said the other serves: the product is being switched between stock modes.
    ReserveOutcome.MOVED: (UNAVAILABLE, "The product is switching stock mode, retry shortly."),
    # Only a reserve that arrives after its own attempt was released answers this, and by then
    # nobody waits for its reply; mapped for completeness.
    ReserveOutcome.ABANDONED: (UNAVAILABLE, unavailable_detail("Stock service")),
    # A second 'rebucket' in a row: the product was set up again meanwhile.
    ReserveOutcome.REBUCKET: (UNAVAILABLE, unavailable_detail("Stock service")),
    Down.STOCK: (UNAVAILABLE, unavailable_detail("Stock service")),
    Down.DATABASE: (UNAVAILABLE, unavailable_detail("Order database")),
    Down.QUEUE: (UNAVAILABLE, unavailable_detail("Order queue")),
    Down.TOKENS: (UNAVAILABLE, unavailable_detail("Token store")),
    Down.REBALANCING: (UNAVAILABLE, "Stock is being rebalanced, retry shortly."),
}
"""Every rejection of the purchase path, in both stock modes: reserve outcome (or why a store
failed) -> (error code of the HTTP contract, detail)."""
OVER_LIMIT = "quantity is above the product's per-user limit."


def rejected(why: ReserveOutcome | Down, retry_after: int | None = None) -> PurchaseRejected:
    """The rejection ``why`` answers (:data:`REJECTIONS`)."""
    code, detail = REJECTIONS[why]
    return PurchaseRejected(code, detail, retry_after)


def flag_answer(verdict: FlagAnswer) -> DomainError:
    """The error a standing sold-out flag answers: the same as ``reserve.lua`` would."""
    if verdict is FlagAnswer.OVER_LIMIT:
        return InvalidInput("quantity", OVER_LIMIT)
    return rejected(ReserveOutcome.SOLD_OUT)
