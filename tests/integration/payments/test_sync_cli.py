"""``flashsale payments sync`` on an order that has no payment attempt says so (exit 0: nothing
failed, there is no channel to ask); on an order that does not exist it says that (exit 1)."""

from __future__ import annotations

import asyncio

import pytest

from service.domain.order_numbers.format import compose_order_no
from tests.support import run_flashsale

pytestmark = pytest.mark.slow  # runs CLI processes


async def test_sync_of_an_order_without_a_payment_attempt_says_so(one_order, settings, consumer):
    order_no = await one_order("never-paying")
    done = await asyncio.to_thread(run_flashsale, settings, "payments", "sync", order_no)
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr.strip() == f"{order_no}: no payment attempt at any channel, nothing to ask"

    unknown = compose_order_no("FS", "20200101000000", 1, 1)  # well-formed, never minted
    missing = await asyncio.to_thread(run_flashsale, settings, "payments", "sync", unknown)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.strip() == f"error: no order {unknown} in MySQL (still queued?)"
