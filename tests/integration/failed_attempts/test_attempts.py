"""A release gives back only what its own HTTP attempt reserved, and a 503 leaves no order behind.

Every reserve carries an attempt token; ``lua/release.lua`` gives back only a ``pending``
reservation made by that attempt, and when the attempt holds nothing it marks it abandoned, so
the attempt's reserve, should it reach Redis later, writes nothing. Real Redis, real scripts
through the RedisStores; a reply lost on the wire is lost by a TCP proxy
(``tests.support.ReplySwallowingProxy``) in front of the real Redis.
"""

from __future__ import annotations

from service.bootstrap import open_api
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.model.stock import ReleaseOutcome, ReserveOutcome, ReserveRequest
from tests.support import (
    buy_losing_the_reserve_reply,
    eventually,
    inventory,
    order_rows,
    own_queues,
    redis_state,
    running_consumer,
)


async def test_a_retry_whose_reserve_reply_is_lost_keeps_the_confirmed_original(
    settings, put_product, product_id, redis, store, engine, proxy
):
    """alice's first attempt is confirmed (202, ``queued``, journal entry unclaimed: no consumer
    yet). Her retry with the same key gets a reserve reply lost on the wire: 503 to the retry, and
    the original keeps its stock, its journal entry and its state, and gets its order row."""
    await put_product(product_id, stock=3, limit=1)
    watcher, port = proxy
    keys = store.product_keys(product_id)
    request_id = mint_request_id()
    async with own_queues(settings, f"retry-lost-{product_id}") as mine:
        healthy = await open_api(mine)
        try:
            accepted = await healthy.purchases.purchase("victim", product_id, 1, request_id)
        finally:
            await healthy.close()
        original_attempt = await redis.hget(keys.replay(request_id), "attempt")
        assert await redis.hget(keys.replay(request_id), "state") == "queued"

        await buy_losing_the_reserve_reply(mine, watcher, port, product_id, request_id)

        # Nothing of the original was given back.
        state = await redis_state(redis, settings, product_id)
        assert state["stock"] == "2"
        assert state["quota"] == {"victim": "1"}
        assert list(state["journal"]) == [request_id]
        assert state["journal"][request_id].split("|")[2] == accepted.order_no
        assert state["journal"][request_id].endswith("|0")  # not claimed yet: a release could have taken it
        replay = await redis.hgetall(keys.replay(request_id))
        assert (replay["state"], replay["order_no"]) == ("queued", accepted.order_no)
        assert replay["attempt"] == original_attempt

        # The consumer writes the original (its claim does not find a `released` tombstone).
        async with running_consumer(mine, engine, store) as consumer:
            rows = await eventually(lambda: order_rows(engine, product_id))
        assert [(row.order_no, row.request_id, row.user_id, row.status) for row in rows] == [
            (accepted.order_no, request_id, "victim", 0)
        ]
        assert consumer.counts.get("released", 0) == 0
    assert await inventory(engine, product_id) == (2, 1)
    assert await redis.get(keys.stock) == "2"


async def test_a_concurrent_first_attempt_whose_reply_is_lost_leaves_the_other_reservation_alone(
    settings, put_product, product_id, redis, store, proxy
):
    """Two first attempts with the same key: A reserved (its publish still in flight, ``pending``);
    B's reserve answers ``in_flight`` but the reply is lost, so B releases with its own token:
    A's reservation stays exactly as it was, and A can still give it back itself."""
    await put_product(product_id, stock=3, limit=1)
    watcher, port = proxy
    keys = store.product_keys(product_id)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261130000000", 96, product_id % 1_000_000)
    first = await store.reservations.reserve(ReserveRequest(product_id, request_id, "victim", 1, order_no, "attempt-a"))
    assert first.outcome is ReserveOutcome.RESERVED
    before = await redis_state(redis, settings, product_id)
    record_before = await redis.hgetall(keys.replay(request_id))
    assert (record_before["state"], record_before["attempt"]) == ("pending", "attempt-a")

    await buy_losing_the_reserve_reply(settings, watcher, port, product_id, request_id)

    after = await redis_state(redis, settings, product_id)
    assert (after["stock"], after["journal"], after["quota"]) == (before["stock"], before["journal"], before["quota"])
    assert after["stock"] == "2"
    record_after = await redis.hgetall(keys.replay(request_id))
    abandoned = [field for field in record_after if field.startswith("abandoned:")]
    assert len(abandoned) == 1  # B's token, so B's own reserve could never take effect later
    assert {k: v for k, v in record_after.items() if k not in abandoned} == record_before

    # A's publish fails after all: A (and only A) gives its reservation back.
    assert await store.reservations.release(product_id, request_id, "attempt-a") is ReleaseOutcome.RELEASED
    final = await redis_state(redis, settings, product_id)
    assert (final["stock"], final["journal"], final["quota"]) == ("3", {}, {})


async def test_a_reserve_arriving_after_its_attempt_was_answered_503_writes_nothing(
    settings, put_product, product_id, redis, store
):
    """The attempt's reserve is still on the wire when the API gives up and releases: release finds
    nothing and marks the attempt abandoned; the late reserve then writes nothing. A new attempt
    with the same key still buys."""
    await put_product(product_id, stock=3, limit=1)
    keys = store.product_keys(product_id)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261130000000", 95, product_id % 1_000_000)

    assert await store.reservations.release(product_id, request_id, "late") is ReleaseOutcome.ABSENT
    assert await store.reservations.release(product_id, request_id, "late") is ReleaseOutcome.ABSENT  # idempotent
    ttl = await redis.ttl(keys.replay(request_id))
    assert 0 < ttl <= settings.orders.replay_ttl_seconds

    late = await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, order_no, "late"))
    assert (late.outcome, late.order_no) == (ReserveOutcome.ABANDONED, "")
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("3", {}, {})
    assert await redis.hgetall(keys.replay(request_id)) == {"abandoned:late": "1"}

    retry = await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, order_no, "retry"))
    assert (retry.outcome, retry.order_no) == (ReserveOutcome.RESERVED, order_no)
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], list(state["journal"]), state["quota"]) == ("2", [request_id], {"u": "1"})


async def test_a_retry_after_a_released_attempt_reuses_its_order_number(
    settings, put_product, product_id, redis, store
):
    """Attempt A took effect and was given back (503); B was abandoned before its reserve arrived;
    C buys, under A's order number. A's late release and B's late reserve change nothing."""
    await put_product(product_id, stock=3, limit=1)
    keys = store.product_keys(product_id)
    request_id = mint_request_id()
    first_no = compose_order_no("FS", "20261130000000", 94, product_id % 1_000_000)
    other_no = compose_order_no("FS", "20261130000001", 94, product_id % 1_000_000)

    assert (
        await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, first_no, "a"))
    ).outcome is ReserveOutcome.RESERVED
    assert await store.reservations.release(product_id, request_id, "a") is ReleaseOutcome.RELEASED
    assert await store.reservations.release(product_id, request_id, "b") is ReleaseOutcome.ABSENT
    assert (
        await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, other_no, "b"))
    ).outcome is ReserveOutcome.ABANDONED

    retry = await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, other_no, "c"))
    assert (retry.outcome, retry.order_no) == (ReserveOutcome.RESERVED, first_no)
    assert (
        await store.reservations.release(product_id, request_id, "a") is ReleaseOutcome.ABSENT
    )  # A's late second release
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], list(state["journal"]), state["quota"]) == ("2", [request_id], {"u": "1"})
    record = await redis.hmget(keys.replay(request_id), "state", "order_no", "attempt")
    assert record == ["pending", first_no, "c"]


async def test_a_release_never_gives_back_a_queued_reservation(settings, put_product, product_id, redis, store):
    """Even the attempt that made it cannot give back a reservation that is already ``queued``
    (re-published by realignment): the order goes through, release answers ``claimed``."""
    await put_product(product_id, stock=3, limit=1)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261130000000", 93, product_id % 1_000_000)
    assert (
        await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, order_no, "a"))
    ).outcome is ReserveOutcome.RESERVED
    assert await store.replays.mark_queued_if_pending(product_id, request_id)
    assert await store.reservations.release(product_id, request_id, "a") is ReleaseOutcome.CLAIMED
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], list(state["journal"]), state["quota"]) == ("2", [request_id], {"u": "1"})
