"""Partitioned order queues (docs/ARCHITECTURE.md) without any server: a product's partition is stable
and every partition gets products, one partition keeps the names of a single queue, the
setting's bounds, the consumers' choice of partitions and the sale's share-out."""

from __future__ import annotations

import click
import pytest
from pydantic import ValidationError

from service.cli.processes import parse_partitions
from service.settings import AMQPSettings, Settings
from toolkit.sale.isolation import consumer_partitions


def _amqp(partitions: int) -> AMQPSettings:
    return AMQPSettings(queue="run_1.orders", partitions=partitions, retry_delays=[0.5, 5.0])


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 64])
def test_a_products_partition_is_stable_and_every_partition_gets_products(partitions: int) -> None:
    amqp, again = _amqp(partitions), _amqp(partitions)
    products = range(10**9, 10**9 + 1000)
    seen = [amqp.partition_of(product) for product in products]
    assert seen == [again.partition_of(product) for product in products]  # another process, the same answer
    assert set(seen) == set(range(partitions))
    counts = [seen.count(partition) for partition in range(partitions)]
    assert max(counts) - min(counts) <= 1  # consecutive ids spread evenly
    for product in products[:50]:
        assert amqp.queue_of(product) == amqp.partition_queue(amqp.partition_of(product))
        assert amqp.partition_of_queue(amqp.queue_of(product)) == amqp.partition_of(product)


def test_one_partition_keeps_the_names_of_a_single_queue() -> None:
    amqp = _amqp(1)
    assert amqp.partition_queues() == ["run_1.orders"]
    assert amqp.queue_of(42) == amqp.queue_of(43) == "run_1.orders"
    assert amqp.retry_queue(0.5) == "run_1.orders.retry.500ms"
    assert amqp.retry_queues() == amqp.retry_queues(0) == ["run_1.orders.retry.500ms", "run_1.orders.retry.5000ms"]
    assert AMQPSettings().partitions == 1


def test_partition_queues_and_their_retry_queues() -> None:
    amqp = _amqp(3)
    assert amqp.partition_queues() == ["run_1.orders.p0", "run_1.orders.p1", "run_1.orders.p2"]
    assert amqp.retry_queue(5.0, 2) == "run_1.orders.p2.retry.5000ms"
    assert amqp.retry_queues(1) == ["run_1.orders.p1.retry.500ms", "run_1.orders.p1.retry.5000ms"]
    assert amqp.retry_queues() == [f"run_1.orders.p{p}.retry.{ms}ms" for p in range(3) for ms in (500, 5000)]
    assert amqp.partition_of_queue("run_1.orders") is None  # not a queue of three partitions
    assert amqp.partition_of_queue(None) is None
    with pytest.raises(ValueError, match="not in 0..2"):
        amqp.partition_queue(3)


@pytest.mark.parametrize("partitions", [0, -1, 65])
def test_the_number_of_partitions_is_bounded(partitions: int) -> None:
    with pytest.raises(ValidationError):
        AMQPSettings(partitions=partitions)


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHSALE_AMQP__PARTITIONS", "3")
    assert Settings(_env_file=None).amqp.partitions == 3  # type: ignore[call-arg]


def test_a_consumer_takes_the_partitions_it_names_or_every_one() -> None:
    amqp = _amqp(3)
    assert amqp.chosen_partitions(None) == amqp.chosen_partitions([]) == [0, 1, 2]
    assert amqp.chosen_partitions([2, 0, 2]) == [0, 2]
    with pytest.raises(ValueError, match=r"\[3\] not in 0..2"):
        amqp.chosen_partitions([0, 3])
    assert parse_partitions(None, amqp) is None
    assert parse_partitions("2, 0", amqp) == [0, 2]
    for wrong in ("3", "-1", "a", ",", ""):
        with pytest.raises(click.BadParameter):
            parse_partitions(wrong, amqp)


@pytest.mark.parametrize("consumers", range(1, 9))
@pytest.mark.parametrize("partitions", range(1, 9))
def test_the_sale_gives_every_partition_a_consumer_and_shares_them_out_evenly(consumers: int, partitions: int) -> None:
    taken = consumer_partitions(consumers, partitions)
    assert len(taken) == consumers
    assert {p for each in taken for p in each} == set(range(partitions))
    assert all(each == sorted(each) and each for each in taken)
    if consumers <= partitions:  # each partition once
        assert sorted(p for each in taken for p in each) == list(range(partitions))
        assert max(map(len, taken)) - min(map(len, taken)) <= 1
    else:  # each consumer one partition, the partitions' consumers differ by one at most
        per_partition = [sum(each == [p] for each in taken) for p in range(partitions)]
        assert max(per_partition) - min(per_partition) <= 1
    assert consumer_partitions(3, 3) == [[0], [1], [2]]
    assert consumer_partitions(2, 3) == [[0, 2], [1]]


def test_the_sale_refuses_no_consumer() -> None:
    with pytest.raises(ValueError):
        consumer_partitions(0, 3)
