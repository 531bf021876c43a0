"""Payments: ``pay`` (a signed notification, as a channel sends it), ``channel`` (the payment
channel simulator), ``payments sync`` (ask the channels) and ``reconcile`` (the channels' bills
against the payments table). The work is in :mod:`service.cli.pay` and
:mod:`service.cli.reconcile`, imported when a command runs."""

from __future__ import annotations

import json
import sys
from datetime import datetime

import click

from service.cli.common import load_settings, run


@click.command()
@click.argument("order_no")
@click.option("--amount", type=click.IntRange(0), default=None, help="Minor units (default: the order's amount).")
@click.option("--txn", "txn_id", default=None, help="The channel's transaction id (default: a new one).")
@click.option(
    "--event",
    type=click.Choice(["paid", "refunded", "refund_failed", "refund_rejected"]),
    default="paid",
    show_default=True,
    help="What happened.",
)
@click.option("--channel", default=None, help="Channel name (default: the first configured).")
@click.option("--currency", default=None, help="ISO 4217 (default: the shop's).")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="The API.")
@click.option("--json", "as_json", is_flag=True, help='Print {"status", "answer"} as one JSON object.')
def pay(
    order_no: str,
    amount: int | None,
    txn_id: str | None,
    event: str,
    channel: str | None,
    currency: str | None,
    url: str,
    as_json: bool,
) -> None:
    """Send a signed payment notification for ORDER_NO, as a payment channel would."""
    from service.cli.pay import send_notification

    settings = load_settings()
    settings.require_secrets()
    response = run(send_notification(settings, order_no, amount, txn_id, event, channel, currency, url))
    if as_json:
        click.echo(json.dumps({"status": response.status_code, "answer": response.json()}))
    else:
        click.echo(f"{response.status_code} {response.text}")


@click.group()
def channel() -> None:
    """The payment channel simulator (an outside party: two channels, mockpay and altpay)."""


@channel.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8100, show_default=True, type=click.IntRange(1, 65535), help="Port of the simulated channels."
)
def channel_serve(host: str, port: int) -> None:
    """Serve the simulated channels over HTTP (one process: the books live in memory)."""
    from service.api.serving import serve_app

    serve_app("toolkit.channel.app:create_channel_app", host, port, 1)


@channel.command("pay")
@click.argument("order_no")
@click.option("--channel", "channel_name", default="mockpay", show_default=True, help="The channel to pay at.")
@click.option("--url", default=None, help="The channel's base URL (default: FLASHSALE_PAYMENT__CHANNEL_URLS).")
def channel_pay(order_no: str, channel_name: str, url: str | None) -> None:
    """The buyer pays ORDER_NO at a running simulator (after POST /api/v1/orders/{order_no}/pay)."""
    import httpx

    base = url or load_settings().payment.channel_urls.get(channel_name)
    if base is None:
        raise click.BadParameter(f"no URL for channel {channel_name}")
    try:
        response = httpx.post(f"{base}/payments/{order_no}/pay", timeout=10)
    except httpx.HTTPError as exc:
        source = "--url" if url else "FLASHSALE_PAYMENT__CHANNEL_URLS"
        raise SystemExit(f"error: {channel_name} at {base} ({source}) did not answer: {exc!r}") from None
    click.echo(f"{response.status_code} {response.text}")
    if not response.is_success:
        sys.exit(1)


@click.group()
def payments() -> None:
    """Payments at the channels."""


@payments.command("sync")
@click.argument("order_no")
def payments_sync(order_no: str) -> None:
    """Ask ORDER_NO's channels about its payment; one paid there is applied (as its notification
    would be). One JSON line per channel asked; exit 1 when a channel did not answer or there is
    no such order. An order with no payment attempt has no channel to ask: one line saying so,
    exit 0."""
    import msgspec

    from service.cli.pay import run_sync
    from service.domain.errors import InvalidInput

    try:
        states = run(run_sync(load_settings(), order_no))
    except InvalidInput as exc:
        raise click.BadParameter(exc.detail) from None
    if not states:
        click.echo(f"{order_no}: no payment attempt at any channel, nothing to ask", err=True)
    for state in states:
        click.echo(msgspec.json.encode(state).decode())
    if any(state["status"] == "unavailable" for state in states):
        sys.exit(1)


@click.command()
@click.option("--date", "day", required=True, type=click.DateTime(["%Y-%m-%d"]), help="The UTC day (YYYY-MM-DD).")
@click.option("--channel", "channel_name", default=None, help="Only this channel (default: every channel with a URL).")
@click.option("--apply", "apply_fixes", is_flag=True, help="Apply the safe fixes (payments missing here).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def reconcile(day: datetime, channel_name: str | None, apply_fixes: bool, as_json: bool) -> None:
    """Compare the channels' bills of DATE with the payments table: missing here, missing at the
    channel, amount mismatch, owed back. Exit 0 when clean (after --apply), 1 otherwise."""
    from service.cli.reconcile import print_reconciliation, run_reconcile
    from service.domain.errors import InvalidInput

    try:
        report = run(run_reconcile(load_settings(), day.date(), channel_name, apply_fixes))
    except InvalidInput as exc:
        raise click.BadParameter(exc.detail) from None
    print_reconciliation(report, as_json)
    sys.exit(0 if report.clean else 1)
