"""A ticket's ``opens_at`` is when the room opens: the sale's opening plus the opening draw
(docs/API.md, "Waiting room"), so the waiting page counts down to the draw, not to a sale
opening that has passed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.api.app import create_app
from tests.integration.waiting_room.test_join import join
from tests.support import serving

DRAW_MS = 60_000


async def test_opens_at_is_the_sale_opening_plus_the_draw_until_the_room_opens(settings, admin, token, product_id):
    drawing = settings.model_copy(
        update={"waiting_room": settings.waiting_room.model_copy(update={"opening_draw_ms": DRAW_MS})}
    )
    opened = (datetime.now(UTC) - timedelta(seconds=1)).replace(microsecond=0)  # kept to the second
    async with serving(create_app(drawing), timeout=30) as api:
        body = {"stock": 5, "per_user_limit": 1, "price": 1500, "stock_mode": "redis", "waiting_room": True}
        body["sale_starts_at"] = opened.isoformat()
        assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
        ticket = (await join(api, token("opens-at"), product_id)).json()
    # the sale opened a second ago, the room opens a minute after it: drawn, not yet placed
    assert ticket["opens_at"] == int(opened.timestamp() * 1000) + DRAW_MS
    assert (ticket["state"], ticket["position"], ticket["admission_token"]) == ("waiting", None, None)


async def test_opens_at_is_null_once_the_room_is_open(client, put_product, token, product_id):
    await put_product(product_id, stock=5, limit=1, waiting_room=True)  # the suite's draw is 0: open now
    ticket = (await join(client, token("opened"), product_id)).json()
    assert ticket["opens_at"] is None and ticket["state"] == "admitted"
