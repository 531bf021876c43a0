"""What a product's waiting room answers, in the domain's words (docs/ARCHITECTURE.md, "Waiting
room"): one buyer's visit (``lua/queue.lua``) and the record of a pre-queue's draw."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RoomState(StrEnum):
    """A buyer's state in a product's waiting room, as ``lua/queue.lua`` answers it."""

    WAITING = "waiting"  # in line (position unknown until the sale opens and the pre-queue is drawn)
    ADMITTED = "admitted"  # holds an admission token: may buy until it expires
    SOLD_OUT = "sold_out"  # no units left (units that come back reopen admission)
    CLOSED = "closed"  # the sale ended, or a new sale window started a new room
    NONE = "none"  # a look by a buyer who holds no place (never joined, admission expired or used)
    EARLY = "early"  # a look before the time the buyer's last answer said to ask again
    OFF = "off"  # the product has no waiting room
    NOT_LOADED = "not_loaded"  # Redis does not know the product's sale


@dataclass(frozen=True, slots=True)
class Visit:
    """One join or look. ``position``: the buyer's place in the line (1 first) and ``ahead`` the
    buyers still waiting before them, None when unknown (before the opening, or not waiting).
    ``units_left``: the product's units Redis can still sell. ``token`` / ``expires_ms`` (Unix
    ms, Redis time): the admission, when ``ADMITTED``. ``waiting`` / ``outstanding``: buyers in
    line and admissions not yet used, after this call. ``opened``: this call found the sale open
    first and fixed the pre-queue's order. ``admitted`` / ``expired``: admissions this call made
    and dropped at their expiry; ``waits_ms`` how long each one admitted now waited (from the
    opening for the pre-queue). ``sale_left_ms``: None for a sale without end. ``holds_unit``: the
    buyer's admission keeps a unit for them; ``held``: units the room keeps for admitted buyers
    (``units_left`` counts them: they are not sold)."""

    state: RoomState
    position: int | None = None
    ahead: int | None = None
    units_left: int = 0
    token: str | None = None
    expires_ms: int | None = None
    waiting: int = 0
    outstanding: int = 0
    opened: bool = False
    admitted: int = 0
    expired: int = 0
    per_user_limit: int = 0
    sale_left_ms: int | None = None
    now_ms: int = 0
    starts_ms: int = 0
    poll_after_ms: int = 0
    holds_unit: bool = False
    held: int = 0
    waits_ms: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RoomPace:
    """How a room admits and paces its buyers (``lua/queue.lua``): admitted-but-not-bought under
    ``ceil(units left x admit_factor)``, each admission lasting ``admission_ttl_ms``; a waiting
    buyer asks again after ``poll_per_ahead_ms`` per buyer ahead, within ``poll_min_ms`` ..
    ``poll_max_ms`` (past the max for the back of a line too long for ``poll_budget_per_second``
    polls a second, 0: no budget); arrivals after the opening count in windows of
    ``arrival_window_ms``. A waiting buyer who
    has not called within ``depart_after_polls`` x the longest interval they were told (at least
    ``poll_max_ms``), plus ``depart_grace_ms`` (a call's time in a loaded server's queue), has
    departed (the place is lost). The room opens ``opening_draw_ms`` after the sale: who joins
    before then is drawn by lottery."""

    admit_factor: float
    admission_ttl_ms: int
    poll_min_ms: int
    poll_max_ms: int
    poll_per_ahead_ms: int
    arrival_window_ms: int
    depart_after_polls: float = 3.0
    poll_budget_per_second: int = 0
    depart_grace_ms: int = 0
    opening_draw_ms: int = 0


@dataclass(frozen=True, slots=True)
class Draw:
    """A product's pre-queue as drawn at the opening of its sale: ``opened_ms`` (Redis time, Unix
    ms), the ``seed`` each place derives from (``""`` when nobody joined before the opening), and
    the user ids in drawn order (:func:`service.domain.waiting_room.lottery.drawn_order`
    reproduces it from the seed and the entrants)."""

    product_id: int
    opened_ms: int
    seed: str
    order: tuple[str, ...]
