"""What ``flashsale sale`` observed: rows read from the stores (:class:`SaleOrderRow`,
:class:`PaymentRow`, :class:`UnpaidOrder`), the stores' state after the sale
(:class:`StoreFacts`), the lifecycle phases (:class:`LifecycleRun`) and everything together
(:class:`Measured`). Plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from service.domain.stock.realign_report import RealignReport
from toolkit.sale.crowd import CrowdRun
from toolkit.sale.plan import Wave


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
    ``status`` ``applied``, ``duplicate``, ``refunding``, ...), with the channel's transaction."""

    order_no: str
    event: str
    status: str
    channel: str
    channel_txn_id: str


@dataclass(frozen=True, slots=True)
class ChannelPayment:
    """A payment in a channel's daily bill (``amount`` in minor units)."""

    channel: str
    channel_txn_id: str
    order_no: str
    amount: int


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
    is missing (units free to sell), ``redis_held`` units the waiting room keeps for admitted
    buyers (not sold either); ``quota`` user -> units Redis counts as held; ``dead_letters`` and
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
    redis_held: int = 0


@dataclass(frozen=True, slots=True)
class LifecycleRun:
    """What the lifecycle phases did (``flashsale sale --pay-share``), after the first drain.

    ``starts``: ``POST /orders/{order_no}/pay`` per order of ``paid_at_channel`` then of the
    ``abandoned`` ones (payments started and never paid); ``payments``: the buyer paying at the
    simulator, one per order of ``paid_at_channel`` (``[shot.index]``); ``notifications``: the
    simulator's counters (sent, dropped, duplicated, delivered, ...); ``unpaid``: orders left
    to lapse; ``wait_seconds``: waiting for the ``window_seconds`` payment window to lapse;
    ``swept``: orders the payment-timeout sweep cancelled; ``returned`` and ``on_sale``: MySQL
    stock gained by the sweep and MySQL stock after it (units); ``resale``: the new buyers'
    wave; ``drain_seconds``: the second drain (None = the queue did not drain);
    ``channel_payments``: every payment in the channels' bills of the day; ``reconciled_clean``
    and ``mismatches``: the reconciliation after it all (mismatch kind -> count).
    """

    pay_share: float
    window_seconds: int
    starts: Wave
    payments: Wave
    paid_at_channel: list[str]
    abandoned: int
    notifications: dict[str, int]
    unpaid: int
    wait_seconds: float
    swept: int
    returned: int
    on_sale: int
    resale: Wave
    drain_seconds: float | None
    channel_payments: list[ChannelPayment]
    reconciled_clean: bool
    mismatches: dict[str, int]


@dataclass(frozen=True, slots=True)
class WaveLoad:
    """What one wave of the Locust crowd cost (:mod:`toolkit.sale.waves`): ``requests`` sent over
    ``seconds`` (first request to last answer) by ``workers`` worker processes, requests per
    host in ``hosts``;
    ``client_cpu`` the workers' CPU seconds over ``client_busy`` seconds of their time (summed
    over the workers); ``server_cpu`` the API's and consumers' CPU seconds (None with ``--url``);
    ``lags`` seconds from when each request (and a crowd buyer's arrival) was due to when it got
    a connection; ``loop_lags`` the workers' event-loop oversleep samples (seconds);
    ``duplicates`` and ``missing`` requests found twice or not at all in the merged trail;
    ``latency_p99`` of the answers (seconds, sent to answered); ``load_average`` this host's
    1-minute load average when the wave ended."""

    label: str
    requests: int
    seconds: float
    workers: int
    hosts: dict[str, int]
    client_cpu: float
    client_busy: float
    server_cpu: float | None
    lags: list[float]
    loop_lags: list[float]
    duplicates: int
    missing: int
    latency_p99: float = 0.0
    load_average: float = 0.0


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything the sale observed. ``noop`` is the framework-ceiling wave (None: skipped, for
    the reason in ``noop_skipped``); ``lifecycle`` None when orders were not paid and resold.
    Seconds for the timings; ``drain_seconds`` None = the queue did not drain. ``queue_timeline``:
    the order queue sampled from the first wave to the end of the last drain
    (epoch seconds, order rows of the product in MySQL, messages ready in the order
    queues). ``crowd``: what every buyer saw when the purchase wave was a crowd
    (``--waiting-room``, ``--crowd``), else None. ``loads``: what each wave cost the client and
    the server, in the order they ran."""

    purchase: Wave
    noop: Wave | None
    noop_skipped: str | None
    lifecycle: LifecycleRun | None
    token_seconds: float
    drain_seconds: float | None
    realignment: RealignReport
    facts: StoreFacts
    queue_timeline: tuple[tuple[float, int, int], ...] = ()
    crowd: CrowdRun | None = None
    loads: tuple[WaveLoad, ...] = ()
