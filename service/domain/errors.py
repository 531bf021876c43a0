"""Domain errors: a rule of the service said no.

Each carries the stable machine ``code`` of the HTTP contract (docs/API.md) and a
``detail`` for people; the HTTP edge maps them to RFC 9457 problem details in one place
(``service.api.problems``). Nothing here knows about HTTP status codes.
"""

from __future__ import annotations

from service.failures import UNAVAILABLE, UNAVAILABLE_RETRY_AFTER


class DomainError(Exception):
    """Base of every error a use case raises on purpose.

    ``code``: stable machine code (e.g. ``sold_out``); ``detail``: human text; ``field``: the
    input field at fault, when there is one; ``retry_after``: seconds after which the same
    request may succeed (transient conditions), else None.
    """

    code = "error"

    def __init__(
        self, detail: str, *, code: str | None = None, field: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.field = field
        self.retry_after = retry_after


class InvalidInput(DomainError):
    """Well-formed input that breaks a rule; ``field`` names it (``code`` ``invalid_request``
    unless a more precise one is given, e.g. ``invalid_order_no``)."""

    code = "invalid_request"

    def __init__(self, field: str, message: str, code: str | None = None) -> None:
        super().__init__(f"{field}: {message}", code=code, field=field)
        self.input_field = field
        self.message = message


class ProductNotFound(DomainError):
    """No product with this id (``product_not_found``)."""

    code = "product_not_found"

    def __init__(self, product_id: int) -> None:
        super().__init__(f"Product {product_id} does not exist.")
        self.product_id = product_id


class OrderNotFound(DomainError):
    """No such order, or not the caller's (``order_not_found``)."""

    code = "order_not_found"

    def __init__(self, order_no: str) -> None:
        super().__init__(f"No order {order_no}.")
        self.order_no = order_no


class Unavailable(DomainError):
    """A store the use case needs did not answer; retry after ``retry_after`` seconds (``unavailable``)."""

    code = UNAVAILABLE

    def __init__(self, detail: str, retry_after: int = UNAVAILABLE_RETRY_AFTER) -> None:
        super().__init__(detail, retry_after=retry_after)


class Conflict(DomainError):
    """The request is valid but the current state refuses it (``sold_out``, ``order_not_cancellable``,
    ``channel_txn_reused`` ...); ``retry_after`` is set when the state is expected to change soon."""
