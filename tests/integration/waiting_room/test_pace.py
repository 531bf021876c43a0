"""The room decides when a buyer hears of an admission and where a join lands, not how hard the
buyer asks (docs/ARCHITECTURE.md, "Waiting room", fairness rules): polling harder than told learns
nothing sooner, and many parallel joins get no better place than one."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from service.model.waiting_room import RoomPace, RoomState
from tests.integration.waiting_room.test_join import lapse

POLL_MS = 5_000
"""Every waiting buyer is told to come back this much later: long beside the hammering below."""
EXACT = RoomPace(1.0, 60_000, POLL_MS, POLL_MS, 20, 0)
"""One unit admits one buyer; arrivals in exact order, an admission told at the join."""


async def test_polling_harder_than_told_learns_an_admission_no_sooner(product_id, put_product, store, redis):
    await put_product(product_id, stock=1, limit=1, waiting_room=True)
    rooms = store.rooms
    first = await rooms.visit(product_id, "pace-first", join=True, pace=EXACT)
    hammer = await rooms.visit(product_id, "pace-hammer", join=True, pace=EXACT)
    await rooms.visit(product_id, "pace-patient", join=True, pace=EXACT)
    assert (first.state, hammer.state, hammer.ahead) == (RoomState.ADMITTED, RoomState.WAITING, 0)
    due_ms = hammer.now_ms + hammer.poll_after_ms
    # The first buyer's admission lapses: the next call admits the hammering buyer, next in line.
    await lapse(redis, store.product_keys(product_id), "pace-first")
    looks = await asyncio.gather(*(rooms.visit(product_id, "pace-hammer", join=False, pace=EXACT) for _ in range(300)))
    early = [look for look in looks if look.now_ms < due_ms]
    assert early, "the looks took longer than the poll interval: nothing was tested"
    assert sum(look.admitted for look in looks) == 1  # admitted at once, in the room's books
    assert {(look.state, look.token, look.expires_ms) for look in early} == {(RoomState.EARLY, None, None)}
    assert all(look.now_ms + look.poll_after_ms == due_ms for look in early)  # the same due, not pushed on
    # Joining again is no way round: the same place, waiting, the same due.
    again = await rooms.visit(product_id, "pace-hammer", join=True, pace=EXACT)
    if again.now_ms < due_ms:
        assert (again.state, again.token, again.now_ms + again.poll_after_ms) == (RoomState.WAITING, None, due_ms)
    assert all(look.state is RoomState.ADMITTED for look in looks if look.now_ms >= due_ms)

    # Asking as told (at the due time) the buyer hears it; the one behind still waits.
    await asyncio.sleep((due_ms - looks[-1].now_ms) / 1000)
    told = await rooms.visit(product_id, "pace-hammer", join=False, pace=EXACT)
    assert (told.state, told.expires_ms is not None, len(told.token or "")) == (RoomState.ADMITTED, True, 32)
    behind = await rooms.visit(product_id, "pace-patient", join=False, pace=EXACT)
    assert (behind.state, behind.ahead) == (RoomState.WAITING, 0)


async def test_parallel_joins_get_no_better_place_than_one_join(product_id, put_product, store, redis):
    """100 buyers join once and 100 join eight times each, all 900 calls at once in a shuffled
    order: with exact arrival order the first of a script's eight would land it ahead (about 1/9
    of the way down the line against 1/2); within one arrival window the place is drawn, so the
    two groups' mean places differ by chance only (sd about 8 places; bound 5 sd)."""
    pace = RoomPace(1.0, 60_000, POLL_MS, POLL_MS, 20, 60_000)
    await put_product(product_id, stock=1, limit=1, waiting_room=True)
    await store.rooms.visit(product_id, "pace-holder", join=True, pace=pace)  # holds the one admission
    people = [f"pace-person-{i}" for i in range(100)]
    scripts = [f"pace-script-{i}" for i in range(100)]
    calls = people + [script for script in scripts for _ in range(8)]
    random.Random(31).shuffle(calls)
    joins = await asyncio.gather(*(store.rooms.visit(product_id, user, join=True, pace=pace) for user in calls))
    assert {join.state for join in joins} == {RoomState.WAITING}
    line = store.product_keys(product_id).room_line
    assert await redis.zcard(line) == 201  # one place each
    places = {user: rank for rank, user in enumerate(await redis.zrange(line, 0, -1))}
    gap = statistics.fmean(places[u] for u in people) - statistics.fmean(places[u] for u in scripts)
    assert abs(gap) < 41, f"scripts are {gap:.1f} places ahead of people on average"


@pytest.mark.parametrize(("budget", "told_ms"), [(0, 200), (10, 4_000)])
async def test_a_long_line_is_paced_to_the_poll_budget(product_id, put_product, store, budget, told_ms):
    """40 buyers wait behind one admitted holder, told 1 s per buyer ahead within 100-200 ms:
    without a budget the back of the line asks every 200 ms (200 polls/s from 40 buyers); with
    a budget of 10 polls/s the back is told waiting / budget = 4 s, past the 200 ms ceiling, so
    the line's polls stay near the budget however long it grows."""
    pace = RoomPace(1.0, 60_000, 100, 200, 1_000, 0, poll_budget_per_second=budget)
    await put_product(product_id, stock=1, limit=1, waiting_room=True)
    holder = await store.rooms.visit(product_id, "paced-holder", join=True, pace=pace)
    assert holder.state is RoomState.ADMITTED
    joins = [await store.rooms.visit(product_id, f"paced-{i}", join=True, pace=pace) for i in range(40)]
    assert [(j.state, j.ahead, j.waiting) for j in joins] == [(RoomState.WAITING, i, i + 1) for i in range(40)]
    assert joins[0].poll_after_ms == 100  # the front: poll_min
    assert joins[-1].poll_after_ms == told_ms
    ceiling = [max(200, -(-(i + 1) * 1000 // budget)) if budget else 200 for i in range(40)]
    assert [j.poll_after_ms for j in joins] == [min(max(i * 1000, 100), c) for i, c in enumerate(ceiling)]
