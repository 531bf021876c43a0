"""``flashsale product set`` says what it created or changed before its realignment table."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import run_flashsale

pytestmark = pytest.mark.slow  # runs CLI processes


def _product_set(settings, product_id: int, *options: str) -> str:
    done = run_flashsale(settings, "product", "set", str(product_id), *options)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[0]


async def test_product_set_says_what_it_created_or_changed(settings, new_product_id):
    pid = new_product_id()
    created = await asyncio.to_thread(_product_set, settings, pid, "--stock", "100", "--price", "19900", "--limit", "2")
    assert created.startswith(f"product {pid} created: name 'product {pid}', units on sale 100, price 19900, limit 2,")
    assert "stock mode database" in created and "until no end" in created and "order token not required" in created
    assert created.endswith("buckets 1, waiting room off")
    changed = await asyncio.to_thread(
        _product_set, settings, pid, "--stock", "100", "--price", "17900", "--stock-mode", "redis"
    )
    assert changed == f"product {pid} changed: price 19900 -> 17900, stock mode database -> redis"
    room = await asyncio.to_thread(_product_set, settings, pid, "--stock", "100", "--waiting-room", "on")
    assert room == f"product {pid} changed: waiting room off -> on"
    same = await asyncio.to_thread(_product_set, settings, pid, "--stock", "100")
    assert same == f"product {pid} unchanged"
