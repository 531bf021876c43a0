"""Typed fakes of the service's parts, for tests that drive a use case without servers.

Each fake subclasses the real class, so it goes where the real one is typed to go (no
``# type: ignore``), and answers only what the path under test calls; it does not run the
real constructor (no client, no connection), so any other method fails loudly."""

from __future__ import annotations

from collections.abc import Callable

from service.adapters.broker import Publisher
from service.adapters.publish_groups import AfterConfirm
from service.adapters.redis.reservations import Reservations
from service.adapters.redis.stores import RedisStores
from service.domain.order_numbers.minter import OrderNumberMinter
from service.model.order_message import OrderMessage
from service.model.stock import Reservation, ReserveRequest


class FakeReservations(Reservations):
    """Answers every reserve with ``reply`` and counts the calls; ``during`` runs while the
    "round trip" is in flight."""

    def __init__(self, reply: Reservation, during: Callable[[], None] | None = None) -> None:
        self.reply = reply
        self.during = during
        self.calls = 0

    async def reserve(self, request: ReserveRequest) -> Reservation:
        self.calls += 1
        if self.during is not None:
            self.during()
        return self.reply


class FakeStore(RedisStores):
    """The Redis stores as the purchase path's reserve sees them: :class:`FakeReservations`."""

    reservations: FakeReservations

    def __init__(self, reply: Reservation, during: Callable[[], None] | None = None) -> None:
        self.reservations = FakeReservations(reply, during)


class FakeMinter(OrderNumberMinter):
    """Hands out one order number again and again, counting how many were taken."""

    ORDER_NO = "FS20261130000000000000010X"

    def __init__(self) -> None:
        self.taken = 0
        self.given_back: list[str] = []

    async def take(self) -> str:
        self.taken += 1
        return self.ORDER_NO

    def give_back(self, order_no: str) -> None:
        self.given_back.append(order_no)


class FakePublisher(Publisher):
    """Keeps the orders it is asked to publish, confirmed at once."""

    def __init__(self) -> None:
        self.published: list[OrderMessage] = []

    async def publish(self, order: OrderMessage, after: AfterConfirm | None = None) -> None:
        self.published.append(order)
        if after is not None:
            await after([order])
