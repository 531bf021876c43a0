"""The sale's queue sampler ends between two samples: stopped while its queue declare is on the
wire, it leaves the AMQP channel the sale's final checks use open (aiormq closes a channel whose
call was cancelled; the sale then failed counting its dead letters)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from service.adapters.broker import declare_topology
from service.sale.job import sampling_queue
from service.sale.stores import Stores
from tests.support import own_queues


async def test_stopping_the_sampler_mid_declare_leaves_the_channel_open(settings, product_id):
    async with own_queues(settings, "sampler", partitions=2) as mine, AsyncExitStack() as stack:
        stores = await Stores.open(stack, mine)
        await declare_topology(stores.channel, mine.amqp)
        declaring = asyncio.Event()

        class Watched:
            """The sale's stores, saying when the sampler's queue declare leaves."""

            count_orders = stores.count_orders

            async def order_queue_depth(self) -> int:
                declaring.set()
                return await stores.order_queue_depth()

        assert await stores.order_queue_depth() >= 0
        for _ in range(5):
            declaring.clear()
            async with sampling_queue(Watched(), product_id) as timeline:  # type: ignore[arg-type]
                await declaring.wait()
                for _ in range(3):  # a few turns of the loop: the passive declare is on the wire,
                    await asyncio.sleep(0)  # its reply (a broker round trip) not back yet
            assert await stores.order_queue_depth() == 0  # the channel still answers
            assert timeline and timeline[-1][2] == 0  # the sample in flight was finished, not dropped
