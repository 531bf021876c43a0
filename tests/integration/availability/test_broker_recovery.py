"""The broker closes the publisher's channels (the order exchange was deleted: 404 NOT_FOUND
closes a channel that publishes to it): purchases answer 503 and give the stock back, then the
API re-opens its channels, declares the topology again and takes orders, without a restart.

The test works on an exchange and queues of its own (tests/support.own_queues), so deleting the
exchange touches no other test.
"""

from __future__ import annotations

import aio_pika

from service.api.app import create_app
from tests.support import buy, eventually, own_queues, redis_state, serving

RECOVERY_PATIENCE = 20.0
"""Seconds the API gets to publish again (it retries a closed channel once a second)."""


async def test_a_deleted_exchange_is_503_then_recovers_without_restart(settings, admin, token, new_product_id, redis):
    product_id = new_product_id()
    async with own_queues(settings, "delx") as own:
        async with serving(create_app(own), timeout=30) as api:
            body = {"stock": 100, "per_user_limit": 1, "price": 1500, "stock_mode": "redis"}
            assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
            assert (await buy(api, token("before"), product_id)).status_code == 202
            assert (await api.get("/api/v1/health/ready")).status_code == 200

            connection = await aio_pika.connect(settings.amqp.url)
            try:
                channel = await connection.channel()
                await channel.exchange_delete(own.amqp.exchange)
            finally:
                await connection.close()

            failed = await buy(api, token("during"), product_id, key="during-key")
            assert failed.status_code == 503, failed.text
            assert failed.json()["code"] == "unavailable" and "retry-after" in failed.headers
            state = await redis_state(redis, own, product_id)
            assert state["stock"] == "99" and len(state["journal"]) == 1 and "during" not in state["quota"]

            # No restart and nobody re-declares for the API: it re-opens its channels itself.
            users = iter(range(1_000))

            async def accepted_again() -> bool:
                answer = await buy(api, token(f"after{next(users)}"), product_id)
                assert answer.status_code in (202, 503), answer.text
                return answer.status_code == 202

            await eventually(accepted_again, timeout=RECOVERY_PATIENCE, interval=0.2)
            retried = await buy(api, token("during"), product_id, key="during-key")
            assert retried.status_code == 202, retried.text

            async def ready() -> bool:
                return (await api.get("/api/v1/health/ready")).status_code == 200

            await eventually(ready, timeout=RECOVERY_PATIENCE, interval=0.2)
            for user in range(8):  # every channel in turn publishes again
                assert (await buy(api, token(f"steady{user}"), product_id)).status_code == 202

            connection = await aio_pika.connect(settings.amqp.url)
            try:
                channel = await connection.channel()
                queue = await channel.declare_queue(own.amqp.queue, passive=True)
                assert queue.declaration_result.message_count >= 10  # the accepted orders are in the queue
            finally:
                await connection.close()
