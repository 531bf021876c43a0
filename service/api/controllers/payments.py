"""Payment channel notifications (signed with HMAC-SHA256, no JWT)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency

from service.api.media import JSON_BODY_OPT
from service.api.openapi import REQUEST_SCHEMA_OPT, problems
from service.api.params import SignatureHeader
from service.domain.payments.notification import Notification
from service.domain.payments.service import NotifyResult, PaymentService


class PaymentController(Controller):
    path = "/payments"
    tags = ["payments"]

    @post(
        "/notify",
        status_code=200,
        summary="A payment channel's notification (X-Signature: hex HMAC-SHA256 of the body)",
        # reads the raw body itself (the signature covers it)
        opt={
            JSON_BODY_OPT: True,
            REQUEST_SCHEMA_OPT: Notification,
            **problems(
                "invalid_signature", "invalid_order_no", "order_not_found", "channel_txn_reused", "order_queued"
            ),
        },
    )
    async def notify(
        self,
        request: Request[Any, Any, Any],
        payments: NamedDependency[PaymentService],
        x_signature: SignatureHeader = None,
    ) -> NotifyResult:
        """A channel's notification, verified by ``X-Signature`` = hex HMAC-SHA256 of the raw body with
        the channel's secret; fields it does not know are ignored: 200 ``NotifyResult``; 400, 401
        invalid_signature, 404 order_not_found, 409 channel_txn_reused / order_queued (with
        Retry-After: the order is not in MySQL yet, the channel retries)."""
        return await payments.notify(await request.body(), x_signature)
