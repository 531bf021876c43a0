"""Paying an order at a channel: ``POST /orders/{order_no}/pay {"channel"}`` (owner only)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from msgspec import Meta

from service.api.auth import User
from service.api.openapi import problems
from service.api.params import OrderNoPath
from service.domain.payments.checkout import Checkout, PayParameters


class PayRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The channel to pay at (``mockpay``, ``altpay``, ...: ``FLASHSALE_PAYMENT__CHANNEL_URLS``)."""

    channel: Annotated[str, Meta(pattern=r"^[a-z0-9_-]{1,32}$")]


class CheckoutController(Controller):
    path = "/orders"
    tags = ["orders"]

    @post(
        "/{order_no:str}/pay",
        status_code=200,
        summary="Start or resume paying your order at a channel: its pay parameters",
        opt=problems(
            "invalid_order_no",
            "order_not_found",
            "order_queued",
            "order_not_payable",
            "payment_in_progress",
            "channel_unavailable",
        ),
    )
    async def pay(
        self,
        request: Request[User, Any, Any],
        order_no: OrderNoPath,
        data: JSONBody[PayRequest],
        checkout: NamedDependency[Checkout],
    ) -> PayParameters:
        """The channel's pay parameters for the caller's unpaid order. The order number is the
        merchant order number at every channel and on every retry; an open attempt at another
        channel is closed there first (``409 payment_in_progress`` when that close cannot be
        confirmed; ``409 order_not_payable`` when the buyer had paid there)."""
        return await checkout.start(request.user.id, order_no, data.channel)
