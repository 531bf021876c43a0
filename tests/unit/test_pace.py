"""The adaptive linger (service/pace.py) and the publisher's groups that follow it: no wait while
orders come far apart, groups that grow as they come close together."""

from __future__ import annotations

import asyncio

from service.adapters.publish_groups import Group, Grouper
from service.domain.order_numbers.format import compose_order_no
from service.model.order_message import OrderMessage
from service.pace import Pace

CAP = 0.010


def _paced(gap: float, orders: int, pace: Pace | None = None, start: float = 100.0) -> Pace:
    pace = pace or Pace(CAP, 64)
    for i in range(orders):
        pace.arrived(start + i * gap)
    return pace


def test_a_quiet_queue_waits_for_nothing() -> None:
    assert Pace(CAP, 64).linger() == 0.0  # the first order of all
    assert _paced(0.5, 10).linger() == 0.0  # two a second
    assert _paced(CAP * 1.5, 200).linger() == 0.0  # further apart than the cap


def test_a_stampede_waits_the_cap_and_a_fast_one_the_time_to_fill() -> None:
    assert _paced(0.001, 50).linger() == CAP  # 1,000 a second: 64 orders take 63 ms, capped
    fast = _paced(0.00005, 200).linger()  # 20,000 a second: a group fills in about 3 ms
    assert 0.0025 < fast < 0.0035


def test_the_pace_follows_the_load_both_ways_within_a_few_orders() -> None:
    pace = _paced(0.001, 15)  # a stampede starts after a quiet spell
    assert pace.linger() == CAP
    _paced(3600.0, 8, pace, start=200.0)  # then an hour between orders counts as quiet, not as an hour
    assert pace.linger() == 0.0
    _paced(0.001, 15, pace, start=1e6)
    assert pace.linger() == CAP


def test_an_arrival_of_many_items_counts_the_gap_per_item() -> None:
    groups = Pace(CAP, 64)
    for i in range(30):  # a group of 20 orders every 20 ms: one order a millisecond
        groups.arrived(100.0 + i * 0.020, items=20)
    assert groups.linger() == CAP
    for i in range(30):  # one order every 20 ms
        groups.arrived(200.0 + i * 0.020)
    assert groups.linger() == 0.0


def _order(i: int) -> OrderMessage:
    return OrderMessage(f"{i:032x}", compose_order_no("FS", "20261206000000", 7, i), f"u{i}", 5, 1, 0, 1500)


async def test_lone_orders_leave_at_once_and_a_burst_shares_lingering_groups() -> None:
    sent: list[tuple[int, bool]] = []  # orders of each group sent, and whether it lingered

    async def send(group: Group) -> None:
        sent.append((len(group.orders), isinstance(group.timer, asyncio.TimerHandle)))

    grouper = Grouper(send, 64, 0.05, adaptive=True)
    await grouper.publish("q", _order(1), None)
    assert sent == [(1, False)]  # quiet: sent at the end of the event-loop turn, no linger

    async def buyer(i: int) -> None:
        await asyncio.sleep(0.0001 * i)  # 300 orders, a tenth of a millisecond apart
        await grouper.publish("q", _order(i), None)

    await asyncio.gather(*(buyer(i) for i in range(2, 302)))
    await grouper.close()
    assert sum(size for size, _ in sent) == 301
    lingered = [size for size, waited in sent if waited]
    assert lingered and max(lingered) > 1  # the pace turned to a stampede: groups waited and grew
    assert len(sent) < 301 / 4


async def test_without_adaptive_every_group_waits_the_linger() -> None:
    sent: list[bool] = []

    async def send(group: Group) -> None:
        sent.append(isinstance(group.timer, asyncio.TimerHandle))

    grouper = Grouper(send, 64, 0.001)
    await grouper.publish("q", _order(1), None)
    assert sent == [True]
