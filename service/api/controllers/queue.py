"""Buyer routes of a product's waiting room: join (``POST``) and poll (``GET .../me``)
(docs/API.md, "Waiting room")."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.datastructures import ResponseHeader
from litestar.di import NamedDependency

from service.api.auth import User
from service.api.openapi import problems
from service.api.params import ProductIdPath
from service.domain.waiting_room.service import Ticket, WaitingRoomService

_PROBLEMS = problems("product_not_found", "waiting_room_off")


def _answer(ticket: Ticket) -> Response[Ticket]:
    headers = {"Cache-Control": "no-store"}
    if ticket.state == "waiting":
        headers["Retry-After"] = str(-(-ticket.poll_after_ms // 1000))  # whole seconds, rounded up
    return Response(ticket, status_code=200, headers=headers)


_RETRY_AFTER = [
    ResponseHeader(
        name="Retry-After", description="While waiting: seconds until the next poll", documentation_only=True
    )
]


class QueueController(Controller):
    path = "/products/{product_id:int}/queue"
    tags = ["waiting room"]

    @post("/", status_code=200, summary="Join the product's waiting room", response_headers=_RETRY_AFTER, opt=_PROBLEMS)
    async def join(
        self, request: Request[User, Any, Any], product_id: ProductIdPath, rooms: NamedDependency[WaitingRoomService]
    ) -> Response[Ticket]:
        """Join the line (one ticket per buyer: joining again answers the same ticket and place;
        after an admission expired or was used, a new place at the back). Errors: 401, 404
        product_not_found, 409 waiting_room_off, 503 unavailable."""
        return _answer(await rooms.join(request.user.id, product_id))

    @get(
        "/me",
        summary="Your ticket's state (poll it)",
        response_headers=_RETRY_AFTER,
        opt=problems("product_not_found", "waiting_room_off", "not_in_queue", "too_many_requests"),
    )
    async def me(
        self, request: Request[User, Any, Any], product_id: ProductIdPath, rooms: NamedDependency[WaitingRoomService]
    ) -> Response[Ticket]:
        """Your ticket's state now; poll it after ``poll_after_ms``. Errors: 401, 404
        product_not_found / not_in_queue (no place: never joined, or the admission expired or
        was used), 409 waiting_room_off, 429 too_many_requests (sooner than the last answer said:
        ``Retry-After``), 503 unavailable."""
        return _answer(await rooms.look(request.user.id, product_id))
