"""The sold-out flags' rules and the purchase path's use of them, without any server."""

from __future__ import annotations

import pytest

from service.domain.errors import InvalidInput
from service.domain.purchase.answers import PurchaseRejected
from service.domain.purchase.service import PurchaseService
from service.domain.purchase.sold_out import FlagAnswer, SoldOutFlags
from service.model.stock import Reservation, ReserveOutcome
from tests.fakes import FakeMinter, FakePublisher, FakeStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def flags(clock: Clock) -> SoldOutFlags:
    flags = SoldOutFlags(1.0, clock=clock)
    flags.following()
    return flags


def test_a_sold_out_answer_raises_the_flag_with_what_it_needs(flags: SoldOutFlags) -> None:
    assert flags.sold_out(7, flags.token(7), stock=0, per_user_limit=2, sale_left_ms=None)
    assert flags.verdict(7, 1) is FlagAnswer.SOLD_OUT
    assert flags.verdict(7, 3) is FlagAnswer.OVER_LIMIT  # reserve.lua checks the limit before the stock
    assert flags.verdict(8, 1) is None  # other products are not flagged


def test_a_flag_answers_only_quantities_above_the_stock_redis_reported(flags: SoldOutFlags) -> None:
    assert flags.sold_out(7, flags.token(7), stock=1, per_user_limit=5, sale_left_ms=None)  # 2 asked, 1 left
    assert flags.verdict(7, 1) is None  # one unit may still be there: ask Redis
    assert flags.verdict(7, 2) is FlagAnswer.SOLD_OUT


def test_a_clear_between_the_token_and_the_answer_keeps_the_flag_down(flags: SoldOutFlags) -> None:
    token = flags.token(7)  # the request starts
    flags.restocked(7)  # a unit comes back while it waits for Redis
    assert not flags.sold_out(7, token, stock=0, per_user_limit=1, sale_left_ms=None)  # its sold_out is stale
    assert flags.verdict(7, 1) is None
    assert flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=None)  # a later one sticks


def test_a_clear_of_another_product_does_not_spoil_the_token(flags: SoldOutFlags) -> None:
    token = flags.token(7)
    flags.restocked(8)
    assert flags.sold_out(7, token, stock=0, per_user_limit=1, sale_left_ms=None)


def test_a_clear_after_the_flag_rose_drops_it(flags: SoldOutFlags) -> None:
    assert flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=None)
    flags.restocked(7)
    assert flags.verdict(7, 1) is None


def test_a_flag_expires_after_its_ttl(flags: SoldOutFlags, clock: Clock) -> None:
    assert flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=None)
    clock.now += 0.999
    assert flags.verdict(7, 1) is FlagAnswer.SOLD_OUT
    clock.now += 0.001
    assert flags.verdict(7, 1) is None


def test_a_flag_never_outlives_the_sale(flags: SoldOutFlags, clock: Clock) -> None:
    assert flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=250)
    clock.now += 0.25
    assert flags.verdict(7, 1) is None  # past the end Redis answers sale_not_active, not sold_out
    assert not flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=0)


def test_no_flag_rises_unless_the_announcements_are_followed(clock: Clock) -> None:
    flags = SoldOutFlags(1.0, clock=clock)
    assert not flags.live
    assert not flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=None)
    flags.following()
    assert flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=None)
    flags.lost()
    assert flags.verdict(7, 1) is None  # announcements may be missed from now on
    assert not flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=None)


def test_a_resubscription_drops_every_flag_and_spoils_older_tokens(flags: SoldOutFlags) -> None:
    assert flags.sold_out(7, flags.token(7), stock=0, per_user_limit=1, sale_left_ms=None)
    token = flags.token(8)
    flags.following()  # reconnected: announcements in between may be lost
    assert flags.verdict(7, 1) is None
    assert not flags.sold_out(8, token, stock=0, per_user_limit=1, sale_left_ms=None)


def test_a_ttl_of_zero_is_refused() -> None:
    with pytest.raises(ValueError):
        SoldOutFlags(0)


# -- the purchase path -----------------------------------------------------------------------


SOLD_OUT = Reservation(ReserveOutcome.SOLD_OUT, "", stock=0, per_user_limit=2, sale_left_ms=None)


def _service(store: FakeStore, minter: FakeMinter, flags: SoldOutFlags) -> PurchaseService:
    return PurchaseService(store, minter, publisher=FakePublisher(), sold_out=flags)


async def _keyless(service: PurchaseService, user: str, product_id: int, quantity: int, request_id: str) -> None:
    """A purchase without an Idempotency-Key, as the HTTP edge makes it: the sold-out shortcut
    (``standing_rejection``) first, then the purchase."""
    if (answer := service.standing_rejection(product_id, quantity)) is not None:
        raise answer
    await service.purchase(user, product_id, quantity, request_id)


async def test_a_flagged_keyless_rejection_takes_no_round_trip_and_no_order_number(flags: SoldOutFlags) -> None:
    store, minter = FakeStore(SOLD_OUT), FakeMinter()
    service = _service(store, minter, flags)
    with pytest.raises(PurchaseRejected) as first:
        await _keyless(service, "u", 7, 1, "r1")
    assert first.value.code == "sold_out" and (store.reservations.calls, minter.taken) == (1, 1)

    for n in range(5):
        with pytest.raises(PurchaseRejected) as again:
            await _keyless(service, f"u{n}", 7, 1, f"r-{n}")
        assert again.value.code == "sold_out"
    with pytest.raises(InvalidInput) as over:
        await _keyless(service, "u", 7, 3, "r-over")
    assert over.value.field == "quantity"
    assert (store.reservations.calls, minter.taken) == (1, 1)  # all answered in the process


async def test_keyed_requests_always_ask_redis(flags: SoldOutFlags) -> None:
    store, minter = FakeStore(SOLD_OUT), FakeMinter()
    service = _service(store, minter, flags)
    for n in range(3):
        with pytest.raises(PurchaseRejected):
            await service.purchase("u", 7, 1, f"keyed-{n}")
    assert store.reservations.calls == 3 and flags.verdict(7, 1) is FlagAnswer.SOLD_OUT  # they still raise the flag


async def test_a_sold_out_that_raced_a_restock_does_not_stick(flags: SoldOutFlags) -> None:
    store = FakeStore(SOLD_OUT, during=lambda: flags.restocked(7))  # the announcement lands mid-call
    service = _service(store, FakeMinter(), flags)
    with pytest.raises(PurchaseRejected):
        await _keyless(service, "u", 7, 1, "r1")
    assert flags.verdict(7, 1) is None
    store.reservations.during = None
    with pytest.raises(PurchaseRejected):
        await _keyless(service, "u", 7, 1, "r2")
    assert store.reservations.calls == 2  # the second one asked Redis, and now the flag stands
    assert flags.verdict(7, 1) is FlagAnswer.SOLD_OUT
