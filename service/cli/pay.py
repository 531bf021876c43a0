"""``flashsale pay`` (sign and send a notification like a channel), ``flashsale sweep`` and
``flashsale payments sync``."""

from __future__ import annotations

import json
import secrets

import httpx

from consumers import observe
from db.queries import orders
from service.bootstrap import opened
from service.domain.order_numbers.format import is_valid_order_no
from service.domain.orders.lifecycle import expire_unpaid
from service.domain.payments.service import Notification, signed
from service.failures import is_outage
from service.log_setup import configure_logging
from service.runtime import watch
from service.settings import Settings
from service.startup import opened_when_reachable


async def _order_amount(settings: Settings, order_no: str) -> int:
    async with opened(settings, publish=False) as resources, resources.engine.connect() as conn:
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


async def run_sweep(
    settings: Settings,
    product_id: int | None,
    every: float | None,
    as_json: bool = False,
    metrics_port: int | None = None,
) -> None:
    """``flashsale sweep``: cancel unpaid orders past the payment window; one pass, or repeated
    every ``every`` seconds until SIGTERM/SIGINT (then ``/metrics`` on ``metrics_port``, default
    ``FLASHSALE_METRICS__PORT``, 0: not served). Each pass prints one line (a JSON object
    ``{"cancelled", "window_seconds", "product_id"}`` with ``as_json``). With ``every`` it
    outlives store outages as ``realign --watch`` does (:func:`service.runtime.watch`)."""
    configure_logging(settings.log_level)
    window = settings.payment.window_seconds
    opening = opened(settings, publish=False) if every is None else opened_when_reachable(settings, publish=False)
    async with opening as resources:
        if resources is None:  # stopped while waiting for a store
            return
        opened_resources = resources

        async def one_pass() -> None:
            cancelled = await expire_unpaid(
                opened_resources.engine,
                opened_resources.store,
                window,
                product_id=product_id,
                may_cancel=opened_resources.checkout.may_cancel,
            )
            if as_json:
                line = json.dumps({"cancelled": cancelled, "window_seconds": window, "product_id": product_id})
            else:
                line = f"cancelled {cancelled} unpaid order(s) past {window}s"
            print(line, flush=True)

        async with observe.exposed(settings, metrics_port if every else 0, sample_queues=False):
            await watch(every, one_pass, survive=is_outage, event="sweep_pass")


async def run_sync(settings: Settings, order_no: str) -> list[dict[str, str | None]]:
    """``flashsale payments sync``: ask the order's channels; a payment found paid is applied.
    One ``{"channel", "status", "applied"}`` per channel asked."""
    configure_logging("WARNING")
    async with opened(settings, publish=False) as resources:
        states = await resources.checkout.sync(order_no)
    return [{"channel": s.channel, "status": s.status, "applied": s.applied} for s in states]
