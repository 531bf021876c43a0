"""Dead-lettered orders: list them with why they died, redrive them to the order queue, or purge
them without leaking stock.

Redrive is safe for any message: the consumer's idempotency (``UNIQUE(request_id)``, the claim
on the reservation) makes a redrive of an order already applied a no-op, and a poison message
simply dies again without holding anything up.

Purge gives a dead-lettered order's reservation back through realignment: the journal entry is
dropped (its replay record becomes a ``released`` tombstone, so a late copy of the message is
dropped by the consumer) and one realignment pass of the product recomputes Redis stock and
quotas from MySQL and the journal left. An order MySQL already has (applied or rejected) holds
no reservation to give back; a message that is no order holds nothing at all.

The consumer dead-letters every order alone, even one of a group; a group reaches this queue
whole only when the broker dead-lettered it (its delivery limit spent by a consumer dying with
it in hand). Such a letter is shown as one view per order (all under the group's id), and
purging it gives back each of its orders as above; a redrive puts the group back whole.

An order can be dead-lettered twice (its consumer killed right after dead-lettering it, before
the ack: the redelivery dies again). Copies with the same id are one order: listed once (with
``copies``), redriven once, purged once; the other copies leave the queue with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from datetime import datetime
from enum import StrEnum

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.queries import orders
from service.adapters.dead_letters import DEFAULT_LIMIT, DeadLetter, DeadLetterQueue
from service.adapters.redis.stores import RedisStores
from service.domain.errors import ProductNotFound
from service.domain.fulfilment.incoming import InvalidOrder, Malformed, parse_body
from service.domain.stock.realign import Realigner
from service.domain.stock.realign_report import RealignReport
from service.model.order_message import OrderMessage

log = structlog.get_logger(__name__)


class DeadLetterView(msgspec.Struct, frozen=True):
    """One dead-lettered message as the operator sees it: ``reason``/``count`` the consumer's
    (or, for one the broker dead-lettered, its newest x-death entry's), ``order`` the order it
    carries (None when the body is no order: ``error`` says why), ``body`` the raw body (UTF-8,
    undecodable bytes replaced), ``detail`` what the consumer said when it dead-lettered it."""

    id: str
    reason: str | None
    count: int
    queue: str | None
    died_at: datetime | None
    order: OrderMessage | None
    error: str | None
    body: str
    detail: str | None = None
    copies: int = 1  # messages with this id in the queue: one order dead-lettered more than once


class PurgeOutcome(StrEnum):
    """What purging one message did."""

    GIVEN_BACK = "given_back"  # reservation dropped, realignment gave stock and quota back
    ALREADY_IN_MYSQL = "already_in_mysql"  # the order has a row: nothing was reserved any more
    NOT_AN_ORDER = "not_an_order"  # undecodable body or unknown product: nothing to give back


class Purged(msgspec.Struct, frozen=True):
    """One purged message: its id, the order it carried (if any), the outcome, and the
    realignment pass that gave the stock back (with ``given_back`` only)."""

    id: str
    order: OrderMessage | None
    outcome: PurgeOutcome
    realign: RealignReport | None = None


class DeadLetterNotFound(LookupError):
    """No message with this id is in the dead-letter queue."""

    def __init__(self, dead_letter_id: str) -> None:
        super().__init__(f"no dead-lettered message {dead_letter_id!r}")
        self.id = dead_letter_id


def _orders(letter: DeadLetter) -> list[OrderMessage]:
    """The orders of ``letter`` that decode (one, or a group's).

    Raises:
        InvalidOrder: its body is neither an order nor a group.
    """
    return parse_body(letter.body).decoded()


def _views(letter: DeadLetter, copies: int = 1) -> list[DeadLetterView]:
    """One view per order ``letter`` carries; one without an order when it carries none (or for
    an order of a group that does not decode)."""
    try:
        carried: list[OrderMessage | Malformed | None] = list(parse_body(letter.body).orders)
        error = None
    except InvalidOrder as exc:
        carried, error = [None], str(exc)
    return [
        DeadLetterView(
            id=letter.id,
            reason=letter.reason,
            count=letter.count,
            queue=letter.queue,
            died_at=letter.died_at,
            order=order if isinstance(order, OrderMessage) else None,
            error=f"malformed order {order.request_id}" if isinstance(order, Malformed) else error,
            body=letter.body.decode("utf-8", errors="replace"),
            detail=letter.error,
            copies=copies,
        )
        for order in carried
    ]


def _distinct(letters: list[DeadLetter]) -> list[tuple[DeadLetter, int]]:
    """The first letter of each id, with how many letters carry that id."""
    copies = Counter(letter.id for letter in letters)
    first = {letter.id: letter for letter in reversed(letters)}
    return [(first[key], copies[key]) for key in copies]


class DeadLetterService:
    """The dead-letter tool's use cases on one deployment's queue, Redis and MySQL."""

    def __init__(self, queue: DeadLetterQueue, engine: AsyncEngine, store: RedisStores, realigner: Realigner) -> None:
        self._queue = queue
        self._engine = engine
        self._store = store
        self._realigner = realigner

    async def entries(self, limit: int = DEFAULT_LIMIT) -> list[DeadLetterView]:
        """Every dead-lettered message (oldest first, at most ``limit``; a group one view per
        order; copies of one id once); nothing is removed."""
        letters = await self._queue.peek(limit)
        return [view for letter, copies in _distinct(letters) for view in _views(letter, copies)]

    async def show(self, dead_letter_id: str) -> list[DeadLetterView]:
        """The message with this id (one view per order of a group).

        Raises:
            DeadLetterNotFound: none.
        """
        found = [view for view in await self.entries() if view.id == dead_letter_id]
        if not found:
            raise DeadLetterNotFound(dead_letter_id)
        return found

    async def redrive(self, ids: Collection[str] | None) -> list[DeadLetterView]:
        """Put the messages with these ids (all when None) back on the order queue; returns them.

        Raises:
            DeadLetterNotFound: an id names no message (checked first: then nothing moves).
        """
        if ids is not None:
            await self._require(ids)
        moved = [view for letter in await self._queue.redrive(ids) for view in _views(letter)]
        log.info("dead_letters_redriven", count=len(moved), request_ids=[view.id for view in moved])
        return moved

    async def purge(self, ids: Collection[str]) -> list[Purged]:
        """Remove the messages with these ids for good, giving back what their orders reserved
        (one :class:`Purged` per order).

        Raises:
            DeadLetterNotFound: an id names no message (checked first: then nothing is removed).
        """
        await self._require(ids)
        purged: list[Purged] = []
        seen: set[str] = set()

        async def give_back(letter: DeadLetter) -> bool:
            if letter.id in seen:
                return True  # another copy of an order purged already
            seen.add(letter.id)
            try:
                orders = _orders(letter)
            except InvalidOrder:
                purged.append(Purged(letter.id, None, PurgeOutcome.NOT_AN_ORDER))
                return True
            purged.extend([await self._give_back(letter.id, order) for order in orders])
            return True

        await self._queue.settle(lambda letter: letter.id in ids, give_back)
        return purged

    async def drop_landed(self) -> int:
        """Remove the dead-lettered copies of orders that have a row by now (realignment
        re-published them and that copy landed, or a redrive did): they hold nothing and would
        only mislead an operator. Returns how many left the queue."""

        async def landed(letter: DeadLetter) -> bool:
            try:
                incoming = parse_body(letter.body)
            except InvalidOrder:
                return False
            request_ids = {order.request_id for order in incoming.decoded()}
            if len(request_ids) < len(incoming.orders):
                return False  # a malformed order of a group (or two of one request) is no row
            async with self._engine.connect() as conn:
                rows = await conn.execute(orders.PRESENT_REQUEST_IDS, {"r": list(request_ids)})
                return set(rows.scalars()) == request_ids

        dropped = await self._queue.settle(lambda _letter: True, landed)
        if dropped:
            log.info("dead_letters_landed_dropped", count=len(dropped), request_ids=[letter.id for letter in dropped])
        return len(dropped)

    async def _give_back(self, letter_id: str, order: OrderMessage) -> Purged:
        async with self._engine.connect() as conn:
            present = (await conn.execute(orders.PRESENT_ORDER_NOS, {"order_nos": [order.order_no]})).first()
        if present is not None:
            return Purged(letter_id, order, PurgeOutcome.ALREADY_IN_MYSQL)
        await self._store.reservations.forget(order.product_id, order.request_id, bucket=order.bucket)
        try:
            report = await self._realigner.realign(order.product_id)
        except ProductNotFound:
            return Purged(letter_id, order, PurgeOutcome.NOT_AN_ORDER)
        log.warning(
            "dead_letter_purged",
            request_id=order.request_id,
            order_no=order.order_no,
            product_id=order.product_id,
            quantity=order.quantity,
        )
        return Purged(letter_id, order, PurgeOutcome.GIVEN_BACK, report)

    async def _require(self, ids: Collection[str]) -> None:
        present = {letter.id for letter in await self._queue.peek()}
        for dead_letter_id in ids:
            if dead_letter_id not in present:
                raise DeadLetterNotFound(dead_letter_id)
