"""An API worker freezes its start-up heap once its lifespan has started
(service.runtime.freeze_startup_heap): full collections under load no longer walk it."""

from __future__ import annotations

import gc

from service.api.app import create_app
from tests.support import serving


async def test_the_api_freezes_its_start_up_heap_when_it_has_started(settings):
    gc.unfreeze()  # whatever an earlier app of this test session froze
    async with serving(create_app(settings)) as client:
        assert gc.get_freeze_count() > 10_000  # the modules, the app, the pools
        response = await client.get("/api/v1/health/live")
        assert response.status_code == 200
