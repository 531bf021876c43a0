"""The pre-queue's lottery: who joins before the sale opens gets a place drawn at random, not by
arrival; who joins after queues in arrival order behind them; the draw is recorded and the seed
reproduces it (docs/ARCHITECTURE.md, "Waiting room")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from service.domain.waiting_room.draws import read_draw
from service.domain.waiting_room.lottery import drawn_order
from tests.integration.waiting_room.test_join import as_told, join, poll
from tests.support import eventually
from toolkit.sale.isolation import environment


async def _recorded(engine, product_id: int):
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT seed, entrants, drawn_order FROM waiting_room_draws WHERE product_id = :p"),
                {"p": product_id},
            )
        ).first()
    return row


async def test_the_pre_queue_is_drawn_at_the_opening_and_later_joiners_queue_behind_in_arrival_order(
    client, put_product, product_id, token, engine, store, settings
):
    opening = datetime.now(UTC) + timedelta(hours=1)
    await put_product(product_id, stock=20, limit=1, waiting_room=True, sale_starts_at=opening.isoformat())
    early = [f"wr-early-{i:03d}" for i in range(300)]
    # The pre-queue joins all at once (bots at 09:59:59.999 among them): no place is known yet.
    answers = await asyncio.gather(*(join(client, token(user), product_id) for user in early))
    bodies = [answer.json() for answer in answers]
    assert {(body["state"], body["position"], body["ahead"]) for body in bodies} == {("waiting", None, None)}
    assert all(1 <= int(answer.headers["Retry-After"]) for answer in answers)
    assert await store.rooms.draw(product_id) is None  # the seed stays secret before the opening

    await put_product(product_id, stock=20, limit=1, waiting_room=True, sale_starts_at=datetime.now(UTC).isoformat())
    late = [f"wr-late-{i:03d}" for i in range(40)]
    for user in late:  # one by one: arrival order
        assert (await join(client, token(user), product_id)).status_code == 200

    record = await eventually(lambda: _recorded(engine, product_id))
    assert record.entrants == len(early)
    expected = drawn_order(record.seed, early) + late
    assert record.drawn_order.split("\n") == expected[: len(early)]
    assert expected[: len(early)] != sorted(early)  # drawn, not by name nor by arrival
    await as_told(settings)
    polled = {user: (await poll(client, token(user), product_id)).json() for user in early + late}
    assert sorted(polled, key=lambda user: polled[user]["position"]) == expected
    assert [polled[user]["position"] for user in expected] == list(range(1, len(expected) + 1))

    draw = await read_draw(engine, store.rooms, product_id)
    assert draw is not None and list(draw.order) == expected[: len(early)] and draw.seed == record.seed
    env = {**os.environ, **environment(settings)}
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "service.cli.main", "product", "draw", str(product_id), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout)
    assert (printed["seed"], printed["entrants"], printed["reproduced"]) == (record.seed, len(early), True)
    assert printed["order"] == expected[: len(early)]
