"""``flashsale pay`` (sign and send a notification like a channel) and ``flashsale payments
sync``."""

from __future__ import annotations

import secrets

import httpx

from db.queries import orders
from service.bootstrap import open_job, opened
from service.domain.order_numbers.format import is_valid_order_no
from service.domain.payments.notification import Notification, signed
from service.log_setup import configure_logging
from service.settings import Settings


async def _order_amount(settings: Settings, order_no: str) -> int:
    async with opened(open_job(settings, publish=False)) as job, job.engine.connect() as conn:
        amount = (await conn.execute(orders.AMOUNT, {"o": order_no})).scalar()
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
) -> httpx.Response:
    """POST a notification signed with the channel's secret; returns the API's 2xx answer.

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
        event=event,  # type: ignore[arg-type]  # click.Choice already limits it to the Literal's values
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
    return response


async def run_sync(settings: Settings, order_no: str) -> list[dict[str, str | None]]:
    """``flashsale payments sync``: ask the order's channels; a payment found paid is applied.
    One ``{"channel", "status", "applied"}`` per channel asked; none when the order has no
    payment attempt.

    Raises:
        SystemExit: no such order in MySQL.
    """
    configure_logging("WARNING")
    async with opened(open_job(settings, publish=False)) as job:
        states = await job.checkout.sync(order_no)
        if not states:
            async with job.engine.connect() as conn:
                if (await conn.execute(orders.AMOUNT, {"o": order_no})).scalar() is None:
                    raise SystemExit(f"error: no order {order_no} in MySQL (still queued?)")
    return [{"channel": s.channel, "status": s.status, "applied": s.applied} for s in states]
