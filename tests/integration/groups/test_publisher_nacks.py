"""A publish the broker nacks, on the real RabbitMQ (docs/ARCHITECTURE.md, "Purchase path"): the
channel that was nacked is not used again (a channel nacked during a queue leader's election
went on being nacked until the old leader was back, while a new one was acked: the RabbitMQ
cluster row of docs/RELIABILITY.md), and each 503 it causes is logged with its cause."""

from __future__ import annotations

import pytest
import structlog

from service.adapters.broker import Publisher
from service.adapters.broker_topology import declare_topology
from service.api import problems
from service.api.app import create_app
from service.failures import PublishFailed
from tests.integration.groups.test_publishing import _refusing
from tests.support import buy, eventually, message_for, serving


async def test_a_nacked_channel_is_replaced_by_a_new_one(own, channel, product_id):
    publisher = Publisher(own.amqp.model_copy(update={"publish_channels": 1, "group_max": 1}))
    await publisher.connect()
    try:
        first = publisher._channels[0]
        await _refusing(own, channel)
        with pytest.raises(PublishFailed, match="Nack"):
            await publisher.publish(message_for(product_id, "nacked", 1))

        async def closed() -> bool:
            return first.is_closed

        await eventually(closed)
        underlay = await channel.get_underlay_channel()
        await underlay.queue_delete(own.amqp.queue)
        await declare_topology(channel, own.amqp)  # the queue takes messages again
        await publisher.publish(message_for(product_id, "after", 2))
        assert publisher._channels[0] is not first
    finally:
        await publisher.close()


async def test_each_503_is_logged_with_its_cause(own, channel, product_id, token, monkeypatch):
    """The broker nacks every purchase: the buyers get 503, and the log says why (once a second
    for one cause: service.log_setup.StormThrottle)."""
    # a fresh logger: the module's own caches its processors on first use (as in test_error_mapping)
    monkeypatch.setattr(problems, "log", structlog.get_logger(problems.__name__))
    async with serving(create_app(own), timeout=60) as api:
        admin = token("admin", admin=True)
        body = {"stock": 5, "per_user_limit": 1, "price": 1500, "stock_mode": "redis"}
        assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
        await _refusing(own, channel)
        with structlog.testing.capture_logs() as logs:
            answer = await buy(api, token("refused"), product_id)
    assert answer.status_code == 503, answer.text
    told = [entry for entry in logs if entry["event"] == "unavailable_answered"]
    assert len(told) == 1
    assert told[0]["cause"] == "Order queue unavailable, retry shortly." and "Nack" in told[0]["error"]
