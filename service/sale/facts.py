"""What ``flashsale sale`` observed: rows read from the stores (:class:`SaleOrderRow`,
:class:`PaymentRow`, :class:`UnpaidOrder`), the stores' state after the sale
(:class:`StoreFacts`), the lifecycle phases (:class:`LifecycleRun`) and everything together
(:class:`Measured`). Plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from service.domain.realign import RealignReport
from service.sale.plan import Wave


@dataclass(frozen=True, slots=True)
class SaleOrderRow:
    """One row of ``orders`` for the sale's product (``quantity`` in units, ``status`` a code,
    ``reason`` of the last change: ``payment_timeout``, ``sold_out``, ...)."""

    order_no: str
    request_id: str
    user_id: str
    quantity: int
    status: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class PaymentRow:
    """One row of ``payments`` for an order of the sale's product (``event`` ``paid``/``refunded``;
    ``status`` ``applied``, ``duplicate``, ``refunding``, ...)."""

    order_no: str
    event: str
    status: str


@dataclass(frozen=True, slots=True)
class UnpaidOrder:
    """An order pending payment: what a channel's notification for it carries (``quantity`` in
    units, ``amount`` in minor currency units)."""

    order_no: str
    user_id: str
    quantity: int
    amount: int


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """The stores after drain and realignment. Stock in units; ``redis_stock`` None when the key
    is missing; ``quota`` user -> units Redis counts as held; ``dead_letters`` and
    ``queue_messages`` are messages added to the dead-letter queue by this sale and messages
    still ready in the order queue."""

    mysql_stock: int
    mysql_sold: int
    orders: list[SaleOrderRow]
    payments: list[PaymentRow]
    redis_stock: int | None
    journal_ids: list[str]
    quota: dict[str, int]
    dead_letters: int
    queue_messages: int


@dataclass(frozen=True, slots=True)
class LifecycleRun:
    """What the lifecycle phases did (``flashsale sale --pay-share``), after the first drain.

    ``payments``: one ``paid`` notification per order of ``notified`` (``notified[shot.index]``);
    ``unpaid``: orders left to lapse; ``wait_seconds``: waiting for the ``window_seconds``
    payment window to lapse; ``swept``: orders the payment-timeout sweep cancelled; ``returned``
    and ``on_sale``: MySQL stock gained by the sweep and MySQL stock after it (units); ``resale``:
    the new buyers' wave; ``drain_seconds``: the second drain (None = the queue did not drain).
    """

    pay_share: float
    window_seconds: int
    payments: Wave
    notified: list[str]
    unpaid: int
    wait_seconds: float
    swept: int
    returned: int
    on_sale: int
    resale: Wave
    drain_seconds: float | None


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything the sale observed. ``noop`` is the framework-ceiling wave (None: skipped, for
    the reason in ``noop_skipped``); ``lifecycle`` None when orders were not paid and resold.
    Seconds for the timings; ``drain_seconds`` None = the queue did not drain. ``drain_timeline``:
    the order queue sampled from the first wave to the end of the first drain,
    (``time.perf_counter()``, order rows in MySQL, messages ready)."""

    purchase: Wave
    noop: Wave | None
    noop_skipped: str | None
    lifecycle: LifecycleRun | None
    token_seconds: float
    drain_seconds: float | None
    realignment: RealignReport
    facts: StoreFacts
    drain_timeline: tuple[tuple[float, int, int], ...] = ()
