"""The consumer's prefetch when none is given: counted in orders, so a backlog of groups is shared
among consumers (docs/BENCHMARKS.md, "The consumer drain")."""

from __future__ import annotations

import pytest

from consumers.consume import PREFETCH_ORDERS, default_prefetch
from service.settings import AMQPSettings


@pytest.mark.parametrize(("group_max", "messages"), [(64, 8), (1, 512), (100, 6), (1000, 1)])
def test_without_a_prefetch_the_consumer_holds_about_512_orders(group_max, messages):
    assert default_prefetch(AMQPSettings(group_max=group_max)) == messages
    assert (messages - 1) * group_max < PREFETCH_ORDERS <= messages * group_max


def test_a_prefetch_given_is_messages():
    assert default_prefetch(AMQPSettings(prefetch=7, group_max=64)) == 7
