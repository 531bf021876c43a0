"""The names the RabbitMQ topology derives from the AMQP settings: the broker addresses in the
order connections try them, the order queue of each partition and product, and the retry queues
(docs/ARCHITECTURE.md, "Order messages and groups"; docs/OPERATIONS.md, "A RabbitMQ cluster").

:class:`QueueTopology` is a mixin of :class:`service.settings.AMQPSettings`, which holds the values
(``FLASHSALE_AMQP__*``): the settings module says what can be configured, this one what follows
from it, and every process asks ``settings.amqp`` for both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING


class QueueTopology:
    """Queue names and partitions, from the fields :class:`service.settings.AMQPSettings` declares."""

    if TYPE_CHECKING:  # declared (and validated) by AMQPSettings; here for the type checker only
        url: str
        failover_urls: list[str]
        queue: str
        partitions: int
        retry_delays: list[float]

    def urls(self) -> list[str]:
        """Every broker address, in the order connections try them: ``url``, then ``failover_urls``."""
        return [self.url, *self.failover_urls]

    def partition_of(self, product_id: int) -> int:
        """The partition (0 … ``partitions`` − 1) of every order of ``product_id``: ``product_id
        mod partitions``, the same in every process and run."""
        return product_id % self.partitions

    def partition_queue(self, partition: int) -> str:
        """Order queue of ``partition``: ``queue`` itself when there is one partition, else
        ``<queue>.p<partition>``. It is also the routing key the queue is bound with on the order
        exchange (and the one its retry queues dead-letter back with)."""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} not in 0..{self.partitions - 1}")
        return self.queue if self.partitions == 1 else f"{self.queue}.p{partition}"

    def partition_queues(self) -> list[str]:
        """Every order queue, partition 0 first."""
        return [self.partition_queue(partition) for partition in range(self.partitions)]

    def queue_of(self, product_id: int) -> str:
        """The order queue (and routing key) of ``product_id``'s orders."""
        return self.partition_queue(self.partition_of(product_id))

    def chosen_partitions(self, partitions: Iterable[int] | None) -> list[int]:
        """``partitions`` sorted, each once; every partition when None or empty (what a consumer
        given them takes).

        Raises:
            ValueError: one is not in 0 … ``partitions`` − 1.
        """
        chosen = sorted(set(partitions or ())) or list(range(self.partitions))
        wrong = [p for p in chosen if not 0 <= p < self.partitions]
        if wrong:
            raise ValueError(f"partitions {wrong} not in 0..{self.partitions - 1} (FLASHSALE_AMQP__PARTITIONS)")
        return chosen

    def partition_of_queue(self, name: str | None) -> int | None:
        """The partition whose order queue (routing key) is ``name``; None for any other name."""
        queues = self.partition_queues()
        return queues.index(name) if name in queues else None

    def retry_queue(self, delay: float, partition: int = 0) -> str:
        """The retry queue of ``delay`` seconds for ``partition``'s order queue:
        ``<order queue>.retry.<ms>ms`` (so the queue names of a run or a test, which rename
        ``queue``, carry their retry queues along; with one partition ``<queue>.retry.<ms>ms``).
        Each partition has its own, which dead-letters back to that partition's queue."""
        return f"{self.partition_queue(partition)}.retry.{round(delay * 1000)}ms"

    def retry_queues(self, partition: int | None = None) -> list[str]:
        """The retry queues of ``partition`` (every partition's when None, partition by
        partition), shortest delay first (each delay once)."""
        partitions = range(self.partitions) if partition is None else [partition]
        delays = sorted(set(self.retry_delays))
        return [self.retry_queue(delay, each) for each in partitions for delay in delays]
