"""A product's waiting room in Redis (docs/ARCHITECTURE.md, "Waiting room"): a buyer's join or
look (``lua/queue.lua``, one round trip, shared with concurrent calls by the hot path's pipeline),
and the pre-queue's draw as recorded at the opening.

Every key lives in the product's slot (:class:`~.keys.ProductKeys`, bucket 0: a product with a
waiting room has one stock bucket), so the script runs on Redis Cluster; ``lua/reserve.lua``
consumes an admission in the same slot. Failures raise
:class:`~service.failures.StoreUnavailable` ``("redis")`` only (:mod:`.boundary`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, cast

from service.adapters.redis.batcher import CommandBatcher
from service.adapters.redis.boundary import translated
from service.adapters.redis.client import RedisClient
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.scripts import Scripts
from service.model.waiting_room import Draw, RoomPace, RoomState, Visit

NONCE_BYTES = 16
"""Random bytes of a call's nonce: the room's secret seed on its first pre-queue join, and what
the admission tokens handed out in the call derive from."""


def parse_visit(reply: Sequence[Any]) -> Visit:
    """``lua/queue.lua``'s reply as a :class:`Visit` (``-1`` and ``''`` read as unknown/none).

    Raises:
        ValueError: a state the script does not answer.
    """
    state = RoomState(reply[0])
    if len(reply) == 1:
        return Visit(state)
    position, ahead, units, token, expires, waiting, outstanding, opened, admitted, expired = reply[1:11]
    limit, left_ms, now_ms, starts_ms, poll_after_ms, holds, held = reply[11:18]
    return Visit(
        state,
        position=None if int(position) < 0 else int(position),
        ahead=None if int(ahead) < 0 else int(ahead),
        units_left=int(units),
        token=str(token) or None,
        expires_ms=int(expires) or None,
        waiting=int(waiting),
        outstanding=int(outstanding),
        opened=bool(int(opened)),
        admitted=int(admitted),
        expired=int(expired),
        per_user_limit=int(limit),
        sale_left_ms=None if int(left_ms) < 0 else int(left_ms),
        now_ms=int(now_ms),
        starts_ms=int(starts_ms),
        poll_after_ms=int(poll_after_ms),
        holds_unit=bool(int(holds)),
        held=int(held),
        waits_ms=tuple(int(wait) for wait in reply[18:]),
    )


class WaitingRooms:
    """The waiting rooms of one key prefix."""

    def __init__(self, redis: RedisClient, scripts: Scripts, batcher: CommandBatcher, key_prefix: str) -> None:
        self._redis = redis
        self._scripts = scripts
        self._batcher = batcher
        self._prefix = key_prefix

    async def visit(self, product_id: int, user_id: str, *, join: bool, pace: RoomPace) -> Visit:
        """``lua/queue.lua``: ``user_id`` joins (``join``) or looks at the product's room, which
        moves on in the same call (a new window's new room, the opening's draw, expired admissions
        and departed buyers dropped, the next in line admitted while admitted buyers who have not
        bought stay under ``ceil(units left x admit_factor)``, each holding a unit with factor 1);
        an admission is told no sooner than the buyer's due time (``pace``)."""
        keys = ProductKeys(self._prefix, product_id)
        reply = await self._scripts.run_batched(
            self._batcher,
            "queue",
            keys=[
                keys.stock,
                keys.sale,
                keys.room,
                keys.room_line,
                keys.room_waiting,
                keys.room_admitted,
                keys.room_grants,
                keys.room_joined,
                keys.room_pre,
                keys.room_due,
                keys.room_seen,
                keys.room_closed,
            ],
            args=[
                user_id,
                "1" if join else "0",
                repr(pace.admit_factor),
                pace.admission_ttl_ms,
                secrets.token_hex(NONCE_BYTES),
                pace.poll_min_ms,
                pace.poll_max_ms,
                pace.poll_per_ahead_ms,
                pace.arrival_window_ms,
                repr(pace.depart_after_polls),
                pace.poll_budget_per_second,
                pace.depart_grace_ms,
                pace.opening_draw_ms,
            ],
        )
        return parse_visit(reply)

    @translated
    async def draw(self, product_id: int) -> Draw | None:
        """The pre-queue as drawn at the opening, or None before the opening (the seed stays
        secret until then) or when Redis holds no room for the product. One round trip (neither
        changes after the opening)."""
        keys = ProductKeys(self._prefix, product_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.room, ["opened_ms", "seed"])
            pipe.zrange(keys.room_pre, 0, -1)
            (opened_ms, seed), order = await pipe.execute()
        if opened_ms is None:
            return None
        return Draw(product_id, int(opened_ms), cast(str | None, seed) or "", tuple(order))

    @translated
    async def counters(self, product_id: int) -> dict[str, int]:
        """The room's counters (``admitted``, ``expired``, ``used``, ``entrants``, ``departed``
        found, ``withdrawn``), sizes (``waiting``: in line and not departed, as of the last call;
        ``outstanding``) and the units ``held`` for admitted buyers now: what operators read. One
        round trip."""
        keys = ProductKeys(self._prefix, product_id)
        names = ["admitted", "expired", "used", "entrants", "departed", "withdrawn", "held", "gone"]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.room, names)
            pipe.zcard(keys.room_waiting)
            pipe.zcard(keys.room_admitted)
            counters, waiting, outstanding = await pipe.execute()
        return {
            **{name: int(value or 0) for name, value in zip(names, counters, strict=True)},
            "waiting": int(waiting) - int(counters[-1] or 0),
            "outstanding": int(outstanding),
        }
