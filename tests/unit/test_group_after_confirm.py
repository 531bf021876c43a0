"""The action a purchase hands the publisher with its order (service/adapters/publish_groups.py):
run once per confirmed group with the orders that came with it, before any of their waits ends;
never for a group that was not confirmed; its failure never fails the orders."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from service.adapters.publish_groups import Group, Grouper
from service.failures import PublishFailed
from service.model.order_message import OrderMessage


def _order(sequence: int) -> OrderMessage:
    return OrderMessage(f"{sequence:032x}", f"FS-{sequence}", f"u{sequence}", 5, 1, 0, 1500)


class _Broker:
    """Confirms (or fails) each group it is sent, keeping what it saw."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.groups: list[list[str]] = []

    async def send(self, group: Group) -> None:
        await asyncio.sleep(0)
        self.groups.append([order.request_id for order in group.orders])
        if self.fail:
            raise PublishFailed("nacked")


async def test_the_action_runs_once_per_group_with_its_orders_before_any_wait_ends():
    broker = _Broker()
    grouper = Grouper(broker.send, max_size=64, linger_seconds=0.01)
    calls: list[list[str]] = []
    finished: list[str] = []

    async def mark(orders: list[OrderMessage]) -> None:
        for _ in range(3):  # turns of the loop in which a caller whose wait had ended would go on
            await asyncio.sleep(0)
        assert finished == []  # no caller's wait has ended yet
        calls.append([order.request_id for order in orders])

    async def buy(order: OrderMessage, with_action: bool) -> None:
        await grouper.publish("q", order, None, mark if with_action else None)
        finished.append(order.request_id)

    orders = [_order(n) for n in range(5)]
    await asyncio.gather(*(buy(order, with_action=n != 2) for n, order in enumerate(orders)))
    assert broker.groups == [[order.request_id for order in orders]]  # one message
    assert calls == [[order.request_id for n, order in enumerate(orders) if n != 2]]  # one call
    assert sorted(finished) == sorted(order.request_id for order in orders)


async def test_an_unconfirmed_group_runs_no_action_and_every_order_fails():
    grouper = Grouper(_Broker(fail=True).send, max_size=64, linger_seconds=0)
    calls: list[list[OrderMessage]] = []

    async def mark(orders: list[OrderMessage]) -> None:
        calls.append(orders)

    results = await asyncio.gather(
        *(grouper.publish("q", _order(n), None, mark) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(result, PublishFailed) for result in results)
    assert calls == []


async def test_a_failing_action_is_logged_and_the_orders_count_as_published():
    grouper = Grouper(_Broker().send, max_size=2, linger_seconds=10)

    async def mark(orders: list[OrderMessage]) -> None:
        raise RuntimeError("redis away")

    with capture_logs() as logs:
        await asyncio.gather(*(grouper.publish("q", _order(n), None, mark) for n in range(2)))  # full: sent at once
    assert [(line["event"], line["orders"]) for line in logs] == [("after_confirm_failed", 2)]


@pytest.mark.parametrize("max_size", [1, 3])
async def test_each_group_runs_its_own_action_call(max_size):
    grouper = Grouper(_Broker().send, max_size=max_size, linger_seconds=10)
    calls: list[int] = []

    async def mark(orders: list[OrderMessage]) -> None:
        calls.append(len(orders))

    await asyncio.gather(*(grouper.publish("q", _order(n), None, mark) for n in range(3)))
    assert calls == ([1, 1, 1] if max_size == 1 else [3])
