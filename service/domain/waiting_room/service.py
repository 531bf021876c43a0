"""Joining and polling a product's waiting room (docs/ARCHITECTURE.md, "Waiting room").

One Redis call per join or poll (``lua/queue.lua``, which also moves the room on: the opening's
draw, expired admissions, the next admissions). A product the process knows is sold out (its
sold-out flag, :mod:`service.domain.purchase.sold_out`) is answered ``sold_out`` without Redis, as
the purchase path answers it, and a ``sold_out`` from Redis raises that flag.

Clients poll rather than follow server-sent events: a poll is stateless behind any load
balancer, a stampede holds no connection per waiting buyer, and ``poll_after_ms`` (with
``Retry-After``) paces them, so how often the room is asked is the server's choice.
"""

from __future__ import annotations

import asyncio
import hashlib

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.queries import products
from service import metrics
from service.adapters.redis.waiting_room import WaitingRooms
from service.domain.errors import Conflict, DomainError, ProductNotFound, Unavailable
from service.domain.purchase.sold_out import FlagAnswer, SoldOutFlags
from service.domain.waiting_room.draws import record_draw
from service.failures import StoreFailure, unavailable_detail
from service.model.waiting_room import RoomPace, RoomState, Visit
from service.settings import WaitingRoomSettings

log = structlog.get_logger(__name__)

CLOSED_POLL_MS = 60_000
"""``poll_after_ms`` of a closed sale: nothing will change, a page may look again much later."""
AHEAD_POLL_MS = 20
"""Milliseconds of ``poll_after_ms`` per buyer ahead (bounded by the settings' poll_min/max_ms):
the front of the line polls often, the back seldom."""


class NotInQueue(DomainError):
    """A look by a buyer who holds no place in the room (``not_in_queue``)."""

    code = "not_in_queue"


class PollTooSoon(DomainError):
    """A look before the time the buyer's last answer said to ask again (``too_many_requests``,
    ``Retry-After``): asking sooner learns nothing sooner."""

    code = "too_many_requests"


class Ticket(msgspec.Struct, frozen=True):
    """A buyer's one ticket in a product's waiting room (the body of the queue routes).
    ``state``: ``waiting`` (``position`` in the line and ``ahead`` of you, null until the place is
    final: the sale open and the buyer's arrival window closed; a final place never moves back),
    ``admitted`` (buy with header ``Admission-Token: <admission_token>`` before
    ``admission_expires_at``, Unix ms; ``holds_unit``: a unit is kept for you until then),
    ``sold_out`` or ``closed`` (the sale ended, or a new sale window started a new room).
    ``units_left``: units not sold (those kept for admitted buyers included). ``admitted``:
    admissions outstanding (buyers admitted who have not bought yet). ``opens_at``: the room's
    opening (Unix ms: the sale's plus the opening draw) while it is ahead, else null.
    ``poll_after_ms``: when to ask again."""

    ticket: str
    product_id: int
    state: str
    position: int | None
    ahead: int | None
    units_left: int
    admission_token: str | None
    admission_expires_at: int | None
    poll_after_ms: int
    holds_unit: bool = False
    admitted: int = 0
    opens_at: int | None = None


def ticket_of(product_id: int, user_id: str) -> str:
    """The buyer's ticket in the product's room: the same on every join, in every process, with
    or without Redis (20 hex; names the place, grants nothing: the buyer's JWT does)."""
    return hashlib.blake2b(f"{product_id}:{user_id}".encode(), digest_size=10).hexdigest()


class WaitingRoomService:
    """Joins and polls of every product's waiting room in one process. ``flags``: the process's
    sold-out flags (None: every call asks Redis)."""

    def __init__(
        self,
        rooms: WaitingRooms,
        engine: AsyncEngine,
        settings: WaitingRoomSettings,
        flags: SoldOutFlags | None = None,
    ) -> None:
        self._rooms = rooms
        self._engine = engine
        self._settings = settings
        self._flags = flags
        self._pace = RoomPace(
            settings.admit_factor,
            settings.admission_ttl_seconds * 1000,
            settings.poll_min_ms,
            settings.poll_max_ms,
            AHEAD_POLL_MS,
            settings.arrival_window_ms,
            settings.depart_after_polls,
            settings.poll_budget_per_second,
            settings.depart_grace_ms,
            settings.opening_draw_ms,
        )
        self._waits: dict[int, metrics.LocalHistogram] = {}
        self._recording: set[asyncio.Task[object]] = set()

    async def join(self, user_id: str, product_id: int) -> Ticket:
        """Join the product's line (or, already in it or admitted, keep the place) and answer the
        ticket's state.

        Raises:
            ProductNotFound: no such product.
            Conflict: ``waiting_room_off``, the product sells without a room.
            Unavailable: Redis failed, or does not know the product's sale yet.
        """
        return await self._visit(user_id, product_id, join=True)

    async def look(self, user_id: str, product_id: int) -> Ticket:
        """The ticket's state now, joining nothing.

        Raises:
            NotInQueue: the buyer holds no place (never joined, the admission expired or was used).
            PollTooSoon: sooner than the buyer's last answer said to ask again.
            ProductNotFound, Conflict, Unavailable: as :meth:`join`.
        """
        return await self._visit(user_id, product_id, join=False)

    async def _visit(self, user_id: str, product_id: int, *, join: bool) -> Ticket:
        flags = self._flags
        token = None
        if flags is not None:
            if flags.verdict(product_id, 1) is FlagAnswer.SOLD_OUT:
                return self._ticket(product_id, user_id, Visit(RoomState.SOLD_OUT))
            token = flags.token(product_id)
        try:
            visit = await self._rooms.visit(product_id, user_id, join=join, pace=self._pace)
        except StoreFailure as exc:
            log.warning("waiting_room_unavailable", product_id=product_id, error=repr(exc))
            raise Unavailable(unavailable_detail("Waiting room")) from exc
        if visit.state is RoomState.OFF:
            raise Conflict("This product sells without a waiting room: buy it directly.", code="waiting_room_off")
        if visit.state is RoomState.NOT_LOADED:
            await self._known(product_id)
            raise Unavailable("The sale is not loaded yet, retry shortly.")
        self._observe(product_id, visit)
        if visit.state is RoomState.EARLY:
            raise PollTooSoon(
                "Ask again when your last answer said (Retry-After): asking sooner learns nothing sooner.",
                retry_after=-(-visit.poll_after_ms // 1000),
            )
        if visit.state is RoomState.NONE:
            raise NotInQueue(
                "You hold no place in this waiting room (never joined, or your admission expired or was used): "
                f"join with POST /api/v1/products/{product_id}/queue."
            )
        if visit.state is RoomState.SOLD_OUT and flags is not None and token is not None:
            flags.sold_out(product_id, token, visit.units_left, visit.per_user_limit, visit.sale_left_ms)
        return self._ticket(product_id, user_id, visit)

    def _ticket(self, product_id: int, user_id: str, visit: Visit) -> Ticket:
        return Ticket(
            ticket_of(product_id, user_id),
            product_id,
            visit.state.value,
            visit.position,
            visit.ahead,
            max(visit.units_left, 0),
            visit.token,
            visit.expires_ms,
            self._poll_after_ms(visit),
            visit.holds_unit,
            visit.outstanding,
            self._opens_at(visit),
        )

    def _opens_at(self, visit: Visit) -> int | None:
        """When the room opens (the sale's opening plus the opening draw: the draw is made and
        admissions begin then), while that is ahead; else None."""
        opens = visit.starts_ms + self._pace.opening_draw_ms
        return opens if visit.now_ms and visit.now_ms < opens else None

    def _poll_after_ms(self, visit: Visit) -> int:
        """When this buyer should ask again: while waiting, what the room said (``lua/queue.lua``
        paces it: asking sooner learns nothing new); otherwise ``poll_max_ms``."""
        if visit.state is RoomState.CLOSED:
            return CLOSED_POLL_MS
        if visit.state is not RoomState.WAITING:
            return self._settings.poll_max_ms
        return visit.poll_after_ms

    def _observe(self, product_id: int, visit: Visit) -> None:
        label = str(product_id)
        metrics.WAITING_ROOM_WAITING.labels(label).set(visit.waiting)
        metrics.WAITING_ROOM_OUTSTANDING.labels(label).set(visit.outstanding)
        metrics.WAITING_ROOM_HELD.labels(label).set(visit.held)
        if visit.admitted:
            metrics.local_counter(metrics.WAITING_ROOM_ADMISSIONS, label).inc(visit.admitted)
            waits = self._waits.get(product_id)
            if waits is None:
                waits = self._waits[product_id] = metrics.local_histogram(metrics.WAITING_ROOM_WAIT_SECONDS, label)
            for wait_ms in visit.waits_ms:
                waits.observe(wait_ms / 1000)
        if visit.expired:
            metrics.local_counter(metrics.WAITING_ROOM_EXPIRED, label).inc(visit.expired)
        if visit.opened:
            task: asyncio.Task[object] = asyncio.create_task(self._record(product_id))
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)

    async def _record(self, product_id: int) -> None:
        """The draw's record, off the buyer's answer (``flashsale product draw`` writes it too
        when this one did not get through)."""
        try:
            await record_draw(self._engine, self._rooms, product_id)
        except StoreFailure as exc:
            log.error("waiting_room_draw_not_recorded", product_id=product_id, error=repr(exc))

    async def _known(self, product_id: int) -> None:
        """Redis does not know the product's sale: 404 if MySQL does not know the product either."""
        try:
            async with self._engine.connect() as conn:
                row = (await conn.execute(products.ROUTING, {"id": product_id})).first()
        except StoreFailure as exc:
            raise Unavailable(unavailable_detail("Product database")) from exc
        if row is None:
            raise ProductNotFound(product_id)

    async def aclose(self) -> None:
        """Wait for the draw records still being written."""
        if self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)
