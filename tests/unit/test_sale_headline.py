"""The sale's headline names the no-op requests only when that wave was sent, and the queue
partitions when there are several."""

from __future__ import annotations

from toolkit.sale.render import _headline

RUN = {
    "run_id": "sale_1",
    "product_id": 7,
    "stock": 10,
    "per_user_limit": 2,
    "requests": 100,
    "users": 50,
    "concurrency": 8,
    "workers": 2,
    "publish_mode": "confirm",
    "isolated": True,
    "url": "http://127.0.0.1:1",
    "consumers": 2,
    "noop_requests": 10000,
    "pay_share": 0,
    "payment_window_seconds": 5,
}


def test_a_skipped_no_op_wave_is_not_claimed():
    line = _headline(RUN, {"skipped": "the API does not mount POST /api/v1/bench/noop"})
    assert "10000 no-op" not in line and "no-op ceiling skipped" in line


def test_a_sent_no_op_wave_is_counted():
    assert "10000 no-op requests" in _headline(RUN, {"throughput_rps": 1.0})


def test_partitions_are_named_only_when_there_are_several():
    assert "partition" not in _headline(RUN, {}) and "partition" not in _headline(RUN | {"partitions": 1}, {})
    several = RUN | {"partitions": 3, "consumer_partitions": [[0, 2], [1]], "product_partition": 1}
    assert "2 consumers on 3 queue partitions (theirs: 0,2 / 1; the product's: 1)" in _headline(several, {})
