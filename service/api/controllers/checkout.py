"""Paying an order at a channel: ``POST /orders/{order_no}/pay {"channel"}`` (owner only)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody
from msgspec import Meta

from service.api.auth import User
from service.bootstrap import Resources
from service.domain.checkout import PayParameters


class PayRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The channel to pay at (``mockpay``, ``altpay``, ...: ``FLASHSALE_PAYMENT__CHANNEL_URLS``)."""

    channel: Annotated[str, Meta(pattern=r"^[a-z0-9_-]{1,32}$")]


class ProblemBody(msgspec.Struct):
    """RFC 9457 problem details with the stable machine ``code``."""

    type: str
    title: str
    status: int
    detail: str
    code: str


def problem_responses(codes: dict[int, str]) -> dict[int, ResponseSpec]:
    """OpenAPI ``responses`` for error statuses: status -> the ``code`` words it carries."""
    return {
        status: ResponseSpec(
            data_container=ProblemBody,
            description=f"code: {words}",
            media_type="application/problem+json",
            generate_examples=False,
        )
        for status, words in codes.items()
    }


class CheckoutController(Controller):
    path = "/orders"
    tags = ["orders"]

    @post(
        "/{order_no:str}/pay",
        status_code=200,
        summary="Start or resume paying your order at a channel: its pay parameters",
        responses=problem_responses(
            {
                400: "invalid_order_no, invalid_request (unknown channel)",
                401: "unauthorized",
                404: "order_not_found",
                409: "order_queued (Retry-After), order_not_payable, payment_in_progress (Retry-After)",
                415: "unsupported_media_type",
                503: "channel_unavailable (Retry-After)",
            }
        ),
    )
    async def pay(
        self,
        request: Request[User, Any, Any],
        order_no: FromPath[str],
        data: JSONBody[PayRequest],
        resources: NamedDependency[Resources],
    ) -> PayParameters:
        """The channel's pay parameters for the caller's unpaid order. The order number is the
        merchant order number at every channel and on every retry; an open attempt at another
        channel is closed there first (``409 payment_in_progress`` when that close cannot be
        confirmed; ``409 order_not_payable`` when the buyer had paid there)."""
        return await resources.checkout.start(request.user.id, order_no, data.channel)
