"""Payment channel notifications (signed with HMAC-SHA256, no JWT)."""

from __future__ import annotations

import msgspec
from litestar import Controller, Request, post
from litestar.di import NamedDependency

from service.api.problems import Problem, field_error, require_order_no
from service.bootstrap import Resources
from service.domain.lifecycle import OrderNotFound
from service.domain.payments import (
    ChannelTxnReused,
    Notification,
    NotifyResult,
    SignatureInvalid,
    handle_notification,
    verify,
)

_decoder = msgspec.json.Decoder(Notification)


class PaymentController(Controller):
    path = "/payments"
    tags = ["payments"]

    @post("/notify", status_code=200, summary="A payment channel's notification (X-Signature: hex HMAC-SHA256 of the body)")
    async def notify(self, request: Request, resources: NamedDependency[Resources]) -> NotifyResult:
        """A channel's notification, verified by ``X-Signature`` = hex HMAC-SHA256 of the raw body with
        the channel's secret: 200 ``NotifyResult``; 400, 401 invalid_signature, 404, 409."""
        raw = await request.body()
        try:
            note = _decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise field_error("body", str(exc)) from None
        except msgspec.DecodeError:
            raise field_error("body", "not a JSON notification") from None
        settings = resources.settings.payment
        try:
            verify(settings.channel_secrets, note.channel, raw, request.headers.get("X-Signature"))
        except SignatureInvalid:
            raise Problem(401, "invalid_signature", "Missing or wrong X-Signature for this channel.") from None
        require_order_no(note.order_no)
        try:
            return await handle_notification(resources.engine, note, raw, settings.currency)
        except OrderNotFound:
            raise Problem(404, "order_not_found", f"No order {note.order_no}.") from None
        except ChannelTxnReused:
            raise Problem(409, "channel_txn_reused", "This channel transaction id belongs to another order.") from None
