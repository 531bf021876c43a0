"""freeze_startup_heap: what start-up built leaves the cyclic collector's passes, in the API's
lifespan and the bare benchmark app's alike (service.runtime.freeze_startup_heap)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from litestar.testing import AsyncTestClient

from service.runtime import freeze_startup_heap
from toolkit.bench.bare_app import create_app


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_objects_alive_at_the_freeze_are_out_of_the_collectors_reach(unfrozen: None) -> None:
    built_at_start_up = [{"pool": n} for n in range(1000)]
    assert gc.get_freeze_count() == 0
    freeze_startup_heap()
    assert gc.get_freeze_count() >= len(built_at_start_up)
    tracked = {id(obj) for obj in gc.get_objects()}  # frozen objects are in no generation
    assert not any(id(obj) in tracked for obj in built_at_start_up)
    made_later = [["request"]]
    assert any(obj is made_later for obj in gc.get_objects())


async def test_the_bare_app_freezes_at_start_up_as_the_api_does(unfrozen: None) -> None:
    async with AsyncTestClient(create_app()) as client:
        assert gc.get_freeze_count() > 0
        response = await client.post("/noop", json={"product_id": 1, "quantity": 1})
        assert response.status_code == 202
