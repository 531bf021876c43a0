"""The sale's queue sampler runs on a thread of its own (toolkit/sale/sampler.py): it keeps
sampling while the sale's event loop is busy sending the load (on that loop it got one sample in
1.3 to 1.8 s during a purchase wave), and its connections are its own, so stopping it leaves the
channel the sale's final checks use open."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

from service.adapters.broker_topology import declare_topology
from tests.support import eventually, own_queues
from toolkit.sale.sampler import sampling_queue
from toolkit.sale.stores import Stores


async def test_the_sampler_samples_while_the_sales_loop_is_busy(settings, product_id):
    async with own_queues(settings, "sampler", partitions=2) as mine, AsyncExitStack() as stack:
        stores = await Stores.open(stack, mine)
        await declare_topology(stores.channel, mine.amqp)
        for _ in range(3):
            async with sampling_queue(mine, product_id) as timeline:

                async def sampled() -> bool:
                    return bool(timeline)

                await eventually(sampled, timeout=30)
                blocked_from = time.time()
                time.sleep(1.0)  # noqa: ASYNC251 - the sale's loop held, as by a load wave
                blocked_until = time.time()
            assert sum(blocked_from < at < blocked_until for at, _, _ in timeline) >= 2
            assert timeline[-1][1:] == (0, 0)  # no order rows, nothing ready
            assert await stores.order_queue_depth() == 0  # the sale's channel still answers
