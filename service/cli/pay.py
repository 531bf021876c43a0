"""``flashsale pay`` (sign and send a notification like a channel) and ``flashsale sweep``."""

from __future__ import annotations

import secrets

import httpx
from sqlalchemy import text

from db.engine import make_engine
from service.bootstrap import make_store
from service.cli.realign import stopped
from service.domain.lifecycle import expire_unpaid
from service.domain.order_no import is_valid_order_no
from service.domain.payments import Notification, signed
from service.log_setup import configure_logging
from service.settings import Settings


async def _order_amount(settings: Settings, order_no: str) -> int:
    engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
    try:
        async with engine.connect() as conn:
            amount = (await conn.execute(text("SELECT amount FROM orders WHERE order_no = :o"), {"o": order_no})).scalar()
    finally:
        await engine.dispose()
    if amount is None:
        raise SystemExit(f"error: no order {order_no} in MySQL (still queued?)")
    return int(amount)


async def send_notification(
    settings: Settings,
    order_no: str,
    amount: int | None,
    txn_id: str | None,
    event: str,
    channel: str | None,
    currency: str | None,
    url: str,
) -> str:
    """POST a notification signed with the channel's secret; returns ``<status> <body>``.

    Raises:
        SystemExit: invalid order number, order not in MySQL, API unreachable, or a non-2xx answer.
    """
    if not is_valid_order_no(order_no):
        raise SystemExit(f"error: {order_no!r} is not a valid order number")
    channel = channel or next(iter(settings.payment.channel_secrets))
    note = Notification(
        channel=channel,
        channel_txn_id=txn_id or f"txn-{secrets.token_hex(8)}",
        order_no=order_no,
        amount=amount if amount is not None else await _order_amount(settings, order_no),
        currency=currency or settings.payment.currency,
        event=event,  # type: ignore[arg-type]
    )
    # An unknown channel is signed with an empty secret: the API answers 401, as it should.
    body, headers = signed(settings.payment.channel_secrets.get(channel, ""), note)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            response = await client.post("/api/v1/payments/notify", content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise SystemExit(f"error: {url} did not answer: {exc!r}") from None
    if not response.is_success:
        raise SystemExit(f"error: {response.status_code} {response.text}")
    return f"{response.status_code} {response.text}"


async def run_sweep(settings: Settings, product_id: int | None, watch: float | None) -> None:
    """``flashsale sweep``: cancel unpaid orders past the payment window; one pass or ``--watch``."""
    configure_logging(settings.log_level)
    engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
    store = make_store(settings)
    try:
        while True:
            cancelled = await expire_unpaid(engine, store, settings.payment.window_seconds, product_id=product_id)
            print(f"cancelled {cancelled} unpaid order(s) past {settings.payment.window_seconds}s", flush=True)
            if watch is None or await stopped(watch):
                return
    finally:
        await store.aclose()
        await engine.dispose()
