"""The waiting room keeps its word, on one Redis and on a three-master Redis Cluster
(docs/ARCHITECTURE.md, "Waiting room"): with factor 1 a turn is a unit held from the call that
admits until it is used or expires; admitted-but-unused stays under ceil(units left x factor)
after purchases and realignments; a place is shown only once final and never moves back; a
buyer who stopped polling departs; a new opening starts a new room and the old line hears
``closed``. Through the service's own adapters (``lua/queue.lua``, ``lua/reserve.lua``,
``lua/realign.lua``), under real concurrency, with exact counts."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from service.adapters.redis.client import make_redis
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.stores import RedisStores, open_stores
from service.domain.waiting_room.lottery import drawn_order
from service.model.stock import ReserveOutcome, ReserveRequest, SaleTerms
from service.model.waiting_room import RoomPace, RoomState, Visit
from service.settings import Settings
from tests import redis_cluster
from tests.integration.waiting_room.test_join import lapse

_ids = itertools.count(700_000)
_versions = itertools.count(1)


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str | None]:
    if not redis_cluster.available():
        yield None
        return
    with redis_cluster.private_redis_cluster() as url:
        yield url


@dataclass
class Room:
    """One product's sale and room on one Redis deployment, through the service's adapters."""

    stores: RedisStores
    product_id: int
    starts_ms: int = 0

    @property
    def keys(self) -> ProductKeys:
        return self.stores.product_keys(self.product_id)

    async def load(self, mysql_stock: int, *, starts_ms: int | None = None) -> None:
        """What realignment writes for MySQL's stock and terms (held units subtracted)."""
        if starts_ms is not None or not self.starts_ms:
            self.starts_ms = starts_ms or int(time.time() * 1000) - 1000
        _, server = await self.stores.stock.journal_size(self.product_id)
        result = await self.stores.stock.realign(
            self.product_id,
            mysql_stock=mysql_stock,
            inventory_version=next(_versions),
            terms=SaleTerms(self.starts_ms, 0, 1, 100, room=1),
            resolved=[],
            dry_run=False,
            server=server,
        )
        assert result is not None and not result.stale

    async def visit(self, user: str, pace: RoomPace, *, join: bool = False) -> Visit:
        return await self.stores.rooms.visit(self.product_id, user, join=join, pace=pace)

    async def buy(self, user: str, admission: str | None):
        request_id = f"r-{user}-{next(_ids)}"
        request = ReserveRequest(self.product_id, request_id, user, 1, f"o{next(_ids)}", "a", admission=admission)
        return await self.stores.reservations.reserve(request)

    async def redis_units(self) -> tuple[int, int]:
        """(stock key: free units, units held by the room)."""
        redis = self.stores.redis
        return int(await redis.get(self.keys.stock)), int(await redis.hget(self.keys.room, "held") or 0)


@pytest.fixture(params=["redis", "cluster"])
async def room(request, settings: Settings, store: RedisStores, cluster_url: str | None) -> AsyncIterator[Room]:
    if request.param == "redis":
        yield Room(store, next(_ids))
        return
    if cluster_url is None:
        pytest.skip(redis_cluster.MISSING)
    own = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": cluster_url, "cluster": True})})
    client = make_redis(own)
    stores = open_stores(client, own.redis.key_prefix)
    await stores.scripts.load()
    try:
        yield Room(stores, next(_ids))
    finally:
        await client.aclose()


def pace(factor: float = 1.0, *, window_ms: int = 0, depart: float = 1000.0) -> RoomPace:
    return RoomPace(factor, 60_000, 100, 200, 20, window_ms, depart_after_polls=depart)


async def told(visit: Visit) -> None:
    """Come back when told (a look sooner is answered 'early')."""
    await asyncio.sleep(visit.poll_after_ms / 1000 + 0.01)


async def test_with_factor_1_each_admission_holds_a_unit_its_buyer_always_gets(room: Room):
    stock, crowd = 5, 14
    await room.load(stock)
    users = [f"t-{i:02d}" for i in range(crowd)]
    joins = dict(zip(users, await asyncio.gather(*(room.visit(u, pace(), join=True) for u in users)), strict=True))
    admitted = {u: v for u, v in joins.items() if v.state is RoomState.ADMITTED}
    assert len(admitted) == stock and all(v.holds_unit for v in admitted.values())
    assert {v.state for u, v in joins.items() if u not in admitted} == {RoomState.WAITING}
    assert await room.redis_units() == (0, stock)  # every unit held, none sold
    # Realignment (MySQL still has every unit: none sold) leaves the held units held.
    await room.load(stock)
    assert await room.redis_units() == (0, stock)
    # Those not admitted cannot take a held unit: 428, not sold out (units are left).
    waiting = sorted((u for u in users if u not in admitted), key=lambda u: joins[u].position or 0)
    pushed = await asyncio.gather(*(room.buy(u, None) for u in waiting))
    assert {r.outcome for r in pushed} == {ReserveOutcome.ADMISSION_REQUIRED}
    # An admission that expires: its unit goes to the next in line at the next call.
    first, *holders = list(admitted)
    await lapse(room.stores.redis, room.keys, first)
    await told(joins[waiting[0]])
    nxt = await room.visit(waiting[0], pace())
    assert (nxt.state, nxt.holds_unit, nxt.expired, nxt.held) == (RoomState.ADMITTED, True, 1, stock)
    assert (await room.visit(first, pace())).state is RoomState.NONE
    holders.append(waiting[0])
    tokens = [admitted[u].token for u in holders[:-1]] + [nxt.token]
    bought = await asyncio.gather(*(room.buy(u, t) for u, t in zip(holders, tokens, strict=True)))
    assert [r.outcome for r in bought] == [ReserveOutcome.RESERVED] * stock
    assert min(r.room or (-1, -1) for r in bought) == (0, 0)  # the last purchase left none
    assert await room.redis_units() == (0, 0)
    late = await asyncio.gather(*(room.visit(u, pace()) for u in waiting[1:]))
    assert {v.state for v in late} == {RoomState.SOLD_OUT}
    assert (await room.stores.rooms.counters(room.product_id))["used"] == stock


async def test_a_realignment_below_the_held_units_withdraws_the_latest_admissions(room: Room):
    await room.load(5)
    users = [f"w-{i}" for i in range(5)]
    for user in users:  # one by one: line order
        assert (await room.visit(user, pace(), join=True)).state is RoomState.ADMITTED
    await room.load(3)  # MySQL lost two units: 3 - 5 held
    assert await room.redis_units() == (-2, 5)
    after = await room.visit("w-0", pace())
    assert (after.state, after.outstanding, after.held, after.units_left) == (RoomState.ADMITTED, 3, 3, 3)
    assert await room.redis_units() == (0, 3)
    assert [(await room.visit(u, pace())).state for u in users[3:]] == [RoomState.NONE] * 2
    assert (await room.stores.rooms.counters(room.product_id))["withdrawn"] == 2


async def test_admitted_but_unused_stays_under_the_bound_after_purchases(room: Room):
    factor, stock, crowd = 1.5, 10, 20
    await room.load(stock)
    users = [f"b-{i:02d}" for i in range(crowd)]
    visits = dict(
        zip(users, await asyncio.gather(*(room.visit(u, pace(factor), join=True) for u in users)), strict=True)
    )
    admitted = {u: v.token for u, v in visits.items() if v.state is RoomState.ADMITTED}
    assert len(admitted) == math.ceil(stock * factor)
    assert not any(v.holds_unit for v in visits.values())
    # The earliest admitted buy: a withdrawal takes the latest first.
    buyers = sorted(admitted, key=lambda u: (visits[u].expires_ms or 0, u))[:5]
    bought = await asyncio.gather(*(room.buy(u, admitted[u]) for u in buyers))
    assert [r.outcome for r in bought] == [ReserveOutcome.RESERVED] * 5
    counters = await room.stores.rooms.counters(room.product_id)
    # 15 - 5 used = 10 outstanding for 5 units: the bound is ceil(5 x 1.5) = 8, so 2 withdrawn.
    assert (counters["outstanding"], counters["withdrawn"], counters["used"]) == (8, 2, 5)
    # The purchases' answers carry what the gauges show; the last one answered is Redis's now.
    assert min(r.room[0] for r in bought if r.room) == 8
    # Whoever buys last, the last unit leaves no admission behind (no buyer beaten keeps one).
    rest = [u for u in admitted if u not in buyers]
    tokens = await asyncio.gather(*(room.visit(u, pace(factor)) for u in rest))
    still = [(u, v.token) for u, v in zip(rest, tokens, strict=True) if v.state is RoomState.ADMITTED]
    assert len(still) == 8
    last = await asyncio.gather(*(room.buy(u, t) for u, t in still))
    outcomes = [r.outcome for r in last]
    assert outcomes.count(ReserveOutcome.RESERVED) == 5
    assert set(outcomes) <= {ReserveOutcome.RESERVED, ReserveOutcome.ADMISSION_REQUIRED, ReserveOutcome.SOLD_OUT}
    counters = await room.stores.rooms.counters(room.product_id)
    assert (counters["outstanding"], counters["used"]) == (0, 10)


async def test_an_admission_a_purchase_withdraws_before_it_was_told_is_gone_like_the_rooms_own(room: Room):
    slow = RoomPace(1.5, 60_000, 5_000, 5_000, 20, 0, depart_after_polls=1000.0)  # told: 5 s on
    await room.load(5)  # ceil(5 x 1.5) = 8 admissions unused at most
    users = [f"g-{i}" for i in range(9)]
    visits = {u: await room.visit(u, slow, join=True) for u in users}  # one by one: line order
    assert [v.state for v in visits.values()] == [RoomState.ADMITTED] * 8 + [RoomState.WAITING]
    # g-0's admission lapses: g-1's look admits g-8, who was told to come back in 5 s.
    await lapse(room.stores.redis, room.keys, "g-0")
    look = await room.visit("g-1", slow)
    assert (look.state, look.expired, look.admitted, look.outstanding) == (RoomState.ADMITTED, 1, 1, 8)
    # g-1 buys: 4 units left admit 6 unused, the latest admission (g-8's) is withdrawn.
    bought = await room.buy("g-1", look.token)
    assert (bought.outcome, bought.room) == (ReserveOutcome.RESERVED, (6, 0))
    assert await room.stores.redis.hexists(room.keys.room_due, "g-8") is False
    # Like an admission the room withdraws itself: nothing to wait for, no place (not 'early').
    gone = await room.visit("g-8", slow)
    assert (gone.state, gone.poll_after_ms, gone.outstanding) == (RoomState.NONE, 5_000, 6)
    assert (await room.stores.rooms.counters(room.product_id))["withdrawn"] == 1


async def test_a_place_is_shown_once_final_and_never_moves_back(room: Room):
    window = 300
    # Four units whose short admissions expire unused: the line moves on every round.
    moving = RoomPace(1.0, 250, 100, 200, 20, window, depart_after_polls=1000.0)
    await room.load(4)
    first = [f"p-{i:02d}" for i in range(30)]
    # Thirty parallel joins in one arrival window: no place is final yet, none is shown, and
    # nobody is admitted before the window closes (a later joiner may yet be placed before).
    joins = await asyncio.gather(*(room.visit(u, moving, join=True) for u in first))
    assert {(v.state, v.position, v.ahead, v.admitted) for v in joins} == {(RoomState.WAITING, None, None, 0)}
    shown: dict[str, list[tuple[int, int | None]]] = {u: [] for u in first}
    later = iter(f"q-{i:02d}" for i in range(80))
    waiting = joins
    for _ in range(8):
        await told(max(waiting, key=lambda v: v.poll_after_ms))
        # Later joiners (later windows) meanwhile; admissions expire and the next are admitted.
        await asyncio.gather(*(room.visit(next(later), moving, join=True) for _ in range(10)))
        looks = await asyncio.gather(*(room.visit(u, moving) for u in first))
        for user, look in zip(first, looks, strict=True):
            if look.state in (RoomState.WAITING, RoomState.ADMITTED) and look.position is not None:
                shown[user].append((look.position, look.ahead if look.state is RoomState.WAITING else 0))
        waiting = [look for look in looks if look.state is RoomState.WAITING] or looks
    # Every place shown is final: a buyer's position never changes, ahead never grows, and the
    # first window's thirty buyers hold the places 1..30, one each.
    finals = {}
    for user, seen in shown.items():
        positions = {position for position, _ in seen}
        assert len(positions) == 1, (user, seen)
        aheads = [ahead for _, ahead in seen]
        assert aheads == sorted(aheads, reverse=True), (user, seen)
        finals[user] = positions.pop()
    assert sorted(finals.values()) == list(range(1, 31))
    counters = await room.stores.rooms.counters(room.product_id)
    assert counters["admitted"] > 4 and counters["expired"] > 0  # the line did move


async def test_a_buyer_who_stopped_polling_departs_is_never_admitted_and_rejoins_at_the_back(room: Room):
    depart = 3.0
    await room.load(1)
    holder = await room.visit("d-holder", pace(depart=depart), join=True)
    assert holder.state is RoomState.ADMITTED
    gone = await room.visit("d-gone", pace(depart=depart), join=True)
    stay = await room.visit("d-stay", pace(depart=depart), join=True)
    # The deadline: the call's time plus 3 x the longest interval the buyer was told, at least
    # 3 x poll_max (200 ms here), counted in its bucket of a quarter of that (150 ms).
    redis = room.stores.redis
    due, longest, bucket = (await redis.hget(room.keys.room_due, "d-gone")).split(":")[:3]
    assert int(bucket) == math.ceil((gone.now_ms + depart * max(gone.poll_after_ms, 200)) / 150)
    assert await redis.hget(room.keys.room_seen, bucket) in ("1", "2")  # the two joined within 150 ms, or not
    assert (gone.waiting, stay.waiting) == (1, 2)
    # What the buyer's silence does later, now: its bucket passes (the other keeps polling).
    await redis.hincrby(room.keys.room_seen, bucket, -1)
    await redis.hincrby(room.keys.room, "gone", 1)
    await redis.hset(room.keys.room_due, "d-gone", f"{due}:{longest}:1")
    await lapse(room.stores.redis, room.keys, "d-holder")  # the unit comes back
    await told(stay)
    nxt = await room.visit("d-stay", pace(depart=depart))
    assert (nxt.state, nxt.waiting, nxt.outstanding, nxt.held) == (RoomState.ADMITTED, 0, 1, 1)
    counters = await room.stores.rooms.counters(room.product_id)
    assert (counters["departed"], counters["waiting"], counters["admitted"], counters["gone"]) == (1, 0, 2, 0)
    assert (await room.visit("d-gone", pace(depart=depart))).state is RoomState.NONE
    back = await room.visit("d-gone", pace(depart=depart), join=True)
    # Behind everyone who ever held a place (its old one stays taken): 4th of 4.
    assert (back.state, back.position, back.ahead) == (RoomState.WAITING, 4, 0)


async def test_a_poll_held_up_in_a_loaded_servers_queue_keeps_the_place_within_the_grace(room: Room):
    # Bound 3 x poll_max (200 ms) = 600 ms, found within a bucket (150 ms) more; with a grace of
    # 3 s the same silence of 1 s keeps the place.
    await room.load(1)
    strict = RoomPace(1.0, 60_000, 100, 200, 20, 0, depart_after_polls=3.0)
    lenient = RoomPace(1.0, 60_000, 100, 200, 20, 0, depart_after_polls=3.0, depart_grace_ms=3000)
    assert (await room.visit("g-holder", strict, join=True)).state is RoomState.ADMITTED
    paces = {"g-strict": strict, "g-grace": lenient}
    joined = {user: await room.visit(user, paces[user], join=True) for user in paces}
    bucket = (await room.stores.redis.hget(room.keys.room_due, "g-grace")).split(":")[2]
    assert int(bucket) == math.ceil((joined["g-grace"].now_ms + 3 * 200 + 3000) / 150)
    await asyncio.sleep(1.0)  # both silent past 600 + 150 ms, within 3.6 s
    back = {user: await room.visit(user, strict) for user in joined}
    assert (back["g-strict"].state, back["g-grace"].state) == (RoomState.NONE, RoomState.WAITING)
    counters = await room.stores.rooms.counters(room.product_id)
    assert (counters["departed"], counters["waiting"]) == (1, 1)


async def test_who_joins_before_the_opening_draw_ends_is_drawn_with_the_pre_queue(room: Room):
    # The sale opened 0.2 s ago; the room opens 1.5 s after it: joins until then are drawn.
    draw_ms = 1500
    drawing = RoomPace(1.0, 60_000, 1000, 2000, 20, 1000, depart_after_polls=1000.0, opening_draw_ms=draw_ms)
    await room.load(3, starts_ms=int(time.time() * 1000) - 200)
    users = [f"s-{i:02d}" for i in range(12)]
    joins = await asyncio.gather(*(room.visit(u, drawing, join=True) for u in users))
    assert {(v.state, v.position, v.admitted) for v in joins} == {(RoomState.WAITING, None, 0)}
    assert await room.stores.rooms.draw(room.product_id) is None  # not drawn yet: the seed stays secret
    dues = {u: int((await room.stores.redis.hget(room.keys.room_due, u)).split(":")[0]) for u in users}
    await asyncio.sleep((room.starts_ms + draw_ms) / 1000 - time.time() + 0.05)
    after = await room.visit("s-late", drawing, join=True)  # arrives after the draw: behind it
    draw = await room.stores.rooms.draw(room.product_id)
    assert draw is not None and draw.order == tuple(drawn_order(draw.seed, users))
    # Told to come at the draw in drawn order (over poll_min here): the first drawn ask first.
    in_order = [dues[u] for u in draw.order]
    assert in_order == sorted(in_order) and in_order[0] >= room.starts_ms + draw_ms and len(set(in_order)) > 1
    assert after.admitted == 3  # the room opened at this call: the first three drawn
    admitted = await room.stores.redis.zrange(room.keys.room_admitted, 0, -1)
    assert sorted(admitted) == sorted(draw.order[:3])
    assert float(await room.stores.redis.zscore(room.keys.room_line, "s-late")) >= 1


async def test_a_new_opening_starts_a_new_room_and_the_old_line_hears_closed(room: Room):
    await room.load(3)
    old = [f"n-{i}" for i in range(5)]
    for user in old:
        await room.visit(user, pace(), join=True)
    tokens = {u: v.token for u in old if (v := await room.visit(u, pace())).state is RoomState.ADMITTED}
    assert len(tokens) == 3 and await room.redis_units() == (0, 3)
    await room.load(3, starts_ms=room.starts_ms + 500)  # a new sale window, open at once
    assert await room.redis_units() == (0, 3)  # realignment keeps the old room's held units apart
    fresh = await room.visit("n-new", pace(), join=True)
    assert (fresh.state, fresh.holds_unit, fresh.held, fresh.units_left) == (RoomState.ADMITTED, True, 1, 3)
    assert [(await room.visit(u, pace())).state for u in old] == [RoomState.CLOSED] * 5
    assert {(await room.buy(u, t)).outcome for u, t in tokens.items()} == {ReserveOutcome.ADMISSION_REQUIRED}
    rejoined = await room.visit("n-0", pace(), join=True)
    assert (rejoined.state, rejoined.held) == (RoomState.ADMITTED, 2)
    assert await room.redis_units() == (1, 2)
