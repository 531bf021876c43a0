"""The ops page's waiting-room section: ``GET /api/v1/admin/ops/waiting-rooms`` (admin), polled by
the page beside ``GET /api/v1/admin/ops``. Read from the waiting-room metrics every API worker
exports (:func:`service.metrics_readings.waiting_rooms`), so it costs the stores nothing.
"""

from __future__ import annotations

import asyncio

from litestar import Controller, get
from litestar.di import NamedDependency

from service import metrics, metrics_readings
from service.api.auth import admin_only
from service.settings import Settings


class OpsRoomsController(Controller):
    tags = ["operations"]

    @get(
        "/api/v1/admin/ops/waiting-rooms",
        guards=[admin_only],
        summary="Per product with a waiting room: line, admissions, tokens, waits (polled by the ops page)",
    )
    async def rooms(self, settings: NamedDependency[Settings]) -> dict[str, dict[str, float | None]] | None:
        """Per product id that has had a waiting room: ``waiting`` buyers in line (not departed),
        admission tokens ``outstanding`` and units ``held`` for admitted buyers, apart from sold
        ones (as the latest join, poll or purchase answered them), ``admitted`` and ``expired``
        so far (every worker summed; the page turns ``admitted`` into a rate), the wait until
        admitted ``wait_p50_seconds`` / ``wait_p99_seconds``. None with metrics off."""
        if not settings.metrics.enabled:
            return None
        metrics.flush()
        return await asyncio.to_thread(metrics_readings.waiting_rooms)
