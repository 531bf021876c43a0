"""What receiving one delivery costs the consumer process, before any write: aio-pika's
``Queue.consume`` (an ``IncomingMessage`` and a task per delivery) against
:class:`service.adapters.subscription.Subscription` (aiormq's ``DeliveredMessage`` in a small
:class:`Delivery`), alternately, on one quorum queue of its own on the broker of the settings
(``FLASHSALE_AMQP__URL``; deleted after). Each round publishes ``--messages`` order-sized
bodies, then takes them with prefetch 256 and one ``multiple`` ack per 100, as the consumer
does. The figure is the process's CPU time per delivery while taking them; the rate is shown
for reference only. No test: nothing is asserted about time.

    .venv/bin/python scripts/bench_receive.py [--messages 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel, AbstractRobustQueue

from service.adapters.subscription import Delivery, Subscription
from service.runtime import run_async
from service.settings import Settings

BODY = (
    b'{"request_id":"0123456789abcdef0123456789abcdef","order_no":"FS202612021000000100000123",'
    b'"user_id":"u-123","product_id":7,"quantity":1,"reserved_at_ms":1764669600000,"amount":1500,"bucket":0}'
)
PREFETCH, ACK_EVERY = 256, 100


async def _fill(channel: AbstractRobustChannel, queue: str, count: int) -> None:
    for start in range(0, count, 500):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(BODY, message_id=uuid.uuid4().hex, correlation_id="bench", delivery_mode=2), queue
                )
                for _ in range(start, min(count, start + 500))
            )
        )


async def _take(count: int, start: Callable[[Callable[[int, Callable[[], Awaitable[None]]], None]], Awaitable[None]]):
    """CPU seconds and wall seconds to take ``count`` deliveries through ``start``'s consumer."""
    done = asyncio.Event()
    seen = 0
    acks: set[asyncio.Task[None]] = set()

    def taken(_tag: int, ack_multiple: Callable[[], Awaitable[None]]) -> None:
        nonlocal seen
        seen += 1
        if seen % ACK_EVERY == 0 or seen == count:
            task = asyncio.ensure_future(ack_multiple())
            acks.add(task)
            task.add_done_callback(acks.discard)
        if seen == count:
            done.set()

    cpu, wall = time.process_time(), time.perf_counter()
    await start(taken)
    await done.wait()
    await asyncio.gather(*acks)
    return time.process_time() - cpu, time.perf_counter() - wall


async def _aio_pika(queue: AbstractRobustQueue, count: int) -> tuple[float, float]:
    tag = ""

    async def start(taken: Callable[[int, Callable[[], Awaitable[None]]], None]) -> None:
        nonlocal tag

        async def on_message(message: AbstractIncomingMessage) -> None:
            taken(message.delivery_tag or 0, lambda: message.ack(multiple=True))

        tag = await queue.consume(on_message)

    spent = await _take(count, start)
    await queue.cancel(tag)
    return spent


async def _subscription(channel: AbstractRobustChannel, queue: str, count: int) -> tuple[float, float]:
    subscription: Subscription | None = None

    async def start(taken: Callable[[int, Callable[[], Awaitable[None]]], None]) -> None:
        nonlocal subscription

        def on_delivery(delivery: Delivery) -> None:
            taken(delivery.delivery_tag, lambda: delivery.ack(multiple=True))

        subscription = Subscription(channel, [queue], on_delivery)
        await subscription.start()

    spent = await _take(count, start)
    assert subscription is not None
    await subscription.stop()
    return spent


async def main(messages: int, rounds: int) -> None:
    connection = await aio_pika.connect_robust(Settings().amqp.url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        name = f"bench-receive-{uuid.uuid4().hex[:8]}"
        queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            results: dict[str, list[tuple[float, float]]] = {"aio-pika Queue.consume": [], "Subscription": []}
            for _ in range(rounds):
                await _fill(channel, name, messages)
                results["aio-pika Queue.consume"].append(await _aio_pika(queue, messages))
                await _fill(channel, name, messages)
                results["Subscription"].append(await _subscription(channel, name, messages))
        finally:
            await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
    print(f"{'consumer':<24} {'CPU us/delivery':>16} {'deliveries/s':>13}")
    for label, spent in results.items():
        cpu = ", ".join(f"{c / messages * 1e6:.1f}" for c, _ in spent)
        rate = ", ".join(f"{messages / w:,.0f}" for _, w in spent)
        print(f"{label:<24} {cpu:>16} {rate:>13}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    run_async(main(args.messages, args.rounds))
