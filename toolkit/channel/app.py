"""The simulator's HTTP API (Litestar), one ledger per named channel (the channels of
``FLASHSALE_PAYMENT__CHANNEL_SECRETS``; by default ``mockpay`` and ``altpay``).

Merchant routes, under ``/{channel}``: ``POST /payments`` (create: pay parameters),
``GET /payments/{order_no}`` (query), ``POST /payments/{order_no}/close``, ``POST /refunds``,
``GET /bill?date=YYYY-MM-DD``. The buyer: ``POST /payments/{order_no}/pay``. The operator of the
simulation: ``GET``/``PUT /faults``, ``GET /health``. Errors: ``{"code", "detail"}`` with the
HTTP status.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime
from typing import Annotated, Any

import httpx
import msgspec
from litestar import Litestar, Request, Response, get, post, put
from litestar.datastructures import State
from litestar.params import FromPath, QueryParameter
from msgspec import Meta

from service.log_setup import configure_logging
from service.settings import Settings, get_settings
from toolkit.channel.ledger import BillLine, Ledger, Payment, Refund, Refused
from toolkit.channel.notifier import Faults, Notifier

OrderNo = Annotated[str, Meta(pattern=r"^[A-Za-z0-9]{1,64}$")]
Amount = Annotated[int, Meta(ge=0, le=2**62)]


class CreatePayment(msgspec.Struct):
    """The merchant's order: ``amount`` minor units in ``currency``; ``notify_url`` gets the
    notifications."""

    order_no: OrderNo
    amount: Amount
    currency: Annotated[str, Meta(pattern=r"^[A-Z]{3}$")]
    notify_url: Annotated[str, Meta(pattern=r"^https?://")]


class PaymentView(msgspec.Struct):
    """A payment as the channel reports it (``status``: ``unpaid``, ``paid``, ``closed``);
    ``pay_url`` is where the buyer pays (the pay parameters)."""

    channel: str
    order_no: str
    channel_txn_id: str
    amount: int
    currency: str
    status: str
    pay_url: str
    paid_at: datetime | None = None


class RefundAsk(msgspec.Struct):
    """The merchant's refund ``refund_no`` of ``amount`` minor units of order ``order_no``."""

    refund_no: Annotated[str, Meta(pattern=r"^[\x21-\x7e]{1,32}$")]
    order_no: OrderNo
    amount: Amount


class RefundView(msgspec.Struct):
    refund_no: str
    order_no: str
    channel_txn_id: str
    payment_txn_id: str
    amount: int
    status: str


class Bill(msgspec.Struct):
    """Every transaction of ``channel`` settled on UTC day ``date``."""

    channel: str
    date: date
    transactions: list[BillLine]


class Sim:
    """The simulation's state: a ledger per channel and the notifier."""

    def __init__(self, settings: Settings, notifier: Notifier) -> None:
        self.ledgers = {name: Ledger(name) for name in settings.payment.channel_secrets}
        self.notifier = notifier

    def ledger(self, channel: str) -> Ledger:
        ledger = self.ledgers.get(channel)
        if ledger is None:
            raise Refused(404, "channel_not_found", f"no channel {channel}")
        return ledger


def _sim(state: State) -> Sim:
    sim: Sim = state.sim
    return sim


def _view(request: Request[Any, Any, Any], payment: Payment) -> PaymentView:
    pay_url = str(request.url_for("buyer_pays", channel=payment.channel, order_no=payment.order_no))
    return PaymentView(
        payment.channel,
        payment.order_no,
        payment.channel_txn_id,
        payment.amount,
        payment.currency,
        payment.status,
        pay_url,
        payment.paid_at,
    )


def _refund_view(refund: Refund) -> RefundView:
    return RefundView(
        refund.refund_no, refund.order_no, refund.channel_txn_id, refund.payment_txn_id, refund.amount, refund.status
    )


def _note(payment: Payment, txn_id: str, event: str, **extra: Any) -> dict[str, Any]:
    return {
        "channel": payment.channel,
        "channel_txn_id": txn_id,
        "order_no": payment.order_no,
        "amount": payment.amount,
        "currency": payment.currency,
        "event": event,
        **extra,
    }


@post("/{channel:str}/payments", status_code=200, sync_to_thread=False)
def create_payment(
    request: Request[Any, Any, Any], channel: FromPath[str], data: CreatePayment, state: State
) -> PaymentView:
    """Create (or return) the payment of ``order_no``: its pay parameters."""
    payment = _sim(state).ledger(channel).create(data.order_no, data.amount, data.currency, data.notify_url)
    return _view(request, payment)


@get("/{channel:str}/payments/{order_no:str}", sync_to_thread=False)
def query_payment(request: Request[Any, Any, Any], channel: FromPath[str], order_no: str, state: State) -> PaymentView:
    """The payment of merchant order ``order_no``; 404 ``payment_not_found``."""
    return _view(request, _sim(state).ledger(channel).get(order_no))


@post("/{channel:str}/payments/{order_no:str}/pay", status_code=200, name="buyer_pays", sync_to_thread=False)
def buyer_pays(request: Request[Any, Any, Any], channel: FromPath[str], order_no: str, state: State) -> PaymentView:
    """The buyer pays: ``paid`` and a notification (409 ``payment_closed``)."""
    sim = _sim(state)
    payment, new = sim.ledger(channel).pay(order_no)
    if new:
        sim.notifier.send(payment.notify_url, channel, _note(payment, payment.channel_txn_id, "paid"))
    return _view(request, payment)


@post("/{channel:str}/payments/{order_no:str}/close", status_code=200, sync_to_thread=False)
def close_payment(request: Request[Any, Any, Any], channel: FromPath[str], order_no: str, state: State) -> PaymentView:
    """Close an unpaid payment; 409 ``already_paid`` (the body names the payment)."""
    return _view(request, _sim(state).ledger(channel).close(order_no))


@post("/{channel:str}/refunds", status_code=202)
async def refund(channel: FromPath[str], data: RefundAsk, state: State) -> RefundView:
    """Take a refund in (``processing``); its outcome comes as a later notification:
    ``refunded``, ``refund_failed`` (the ``fail_refunds`` knob) or ``refund_rejected``."""
    sim = _sim(state)
    ledger = sim.ledger(channel)
    taken, new = ledger.refund(data.refund_no, data.order_no, data.amount)
    if new:
        asyncio.get_running_loop().call_later(0.05, _decide_refund, sim, ledger, taken)
    return _refund_view(taken)


def _decide_refund(sim: Sim, ledger: Ledger, taken: Refund) -> None:
    fail = sim.notifier.chance(sim.notifier.faults.fail_refunds)
    status = ledger.settle(taken, fail)
    payment = ledger.payments[taken.order_no]
    event = {"refunded": "refunded", "failed": "refund_failed", "rejected": "refund_rejected"}[status]
    note = _note(payment, taken.channel_txn_id, event, payment_txn_id=taken.payment_txn_id, refund_no=taken.refund_no)
    note["amount"] = taken.amount
    sim.notifier.send(payment.notify_url, ledger.channel, note)


@get("/{channel:str}/bill", sync_to_thread=False)
def bill(
    channel: FromPath[str], state: State, day: Annotated[date | None, QueryParameter(query="date")] = None
) -> Bill:
    """The day's bill (``?date=YYYY-MM-DD``, UTC, default today): every payment and refund
    settled that day."""
    day = day or datetime.now(UTC).date()
    return Bill(channel, day, _sim(state).ledger(channel).bill(day))


@get("/faults", sync_to_thread=False)
def get_faults(state: State) -> dict[str, Any]:
    """The fault knobs, the notifier's counters and how many notifications are in flight."""
    return _faults_view(_sim(state).notifier)


@put("/faults", sync_to_thread=False)
def set_faults(data: Faults, state: State) -> dict[str, Any]:
    """Set the fault knobs (what is left out is 0)."""
    notifier = _sim(state).notifier
    notifier.faults = data
    return _faults_view(notifier)


def _faults_view(notifier: Notifier) -> dict[str, Any]:
    return {
        "faults": msgspec.to_builtins(notifier.faults),
        "stats": dict(notifier.stats),
        "in_flight": notifier.in_flight,
    }


@get("/health", sync_to_thread=False)
def health() -> dict[str, str]:
    return {"status": "ok"}


def _refused(request: Request[Any, Any, Any], exc: Refused) -> Response[dict[str, str]]:
    return Response({"code": exc.code, "detail": exc.detail}, status_code=exc.status)


def create_channel_app(settings: Settings | None = None) -> Litestar:
    """The simulator app for the channels of ``settings`` (default: the process's settings)."""
    settings = settings or get_settings()
    configure_logging(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        timeout = httpx.Timeout(settings.payment.channel_timeout)
        async with httpx.AsyncClient(timeout=timeout) as client:
            notifier = Notifier(settings.payment.channel_secrets, client)
            app.state.sim = Sim(settings, notifier)
            try:
                yield
            finally:
                await notifier.drain(timeout=5.0)

    return Litestar(
        route_handlers=[
            create_payment,
            query_payment,
            buyer_pays,
            close_payment,
            refund,
            bill,
            get_faults,
            set_faults,
            health,
        ],
        lifespan=[lifespan],
        exception_handlers={Refused: _refused},
        openapi_config=None,
        logging_config=None,  # service.log_setup: the notifications' httpx lines as JSON too
    )
