"""tools/bench_reserve_scripts.py: its pure parts (options, where buckets land, the report's
arithmetic); the measurement itself needs a cluster and is run by hand (docs/SCALING.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from redis.crc import key_slot

from service.adapters.redis.keys import ProductKeys

_PATH = Path(__file__).resolve().parents[2] / "tools" / "bench_reserve_scripts.py"
_spec = importlib.util.spec_from_file_location("bench_reserve_scripts", _PATH)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)

THIRDS = [(0, 5460, "a:1"), (5461, 10922, "b:2"), (10923, 16383, "c:3")]


def test_options_default_to_k1_against_k3_and_refuse_nonsense():
    args = bench.parse_args([])
    assert (tuple(args.buckets), args.json) == ((1, 3), False)
    assert bench.parse_args(["--buckets", "2", "3", "--json"]).buckets == [2, 3]
    for wrong in (["--buckets", "3", "1"], ["--buckets", "1", "4"], ["--duration", "0"], ["--processes", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(wrong)


def test_a_slot_belongs_to_the_master_whose_range_holds_it():
    owner = bench.slot_owner(THIRDS)
    assert [owner(0), owner(5461), owner(16383)] == ["a:1", "b:2", "c:3"]
    with pytest.raises(LookupError):
        bench.slot_owner(THIRDS[:2])(16000)


def test_the_picked_product_has_each_bucket_on_its_own_master():
    owner = bench.slot_owner(THIRDS)
    taken: set[int] = set()
    for buckets in (1, 3, 3):
        product_id = bench.pick_product(owner, buckets, taken)
        assert product_id not in taken
        taken.add(product_id)
        masters = bench.bucket_masters(owner, product_id, buckets)
        assert len(set(masters)) == buckets
        # the tags are the service's own: {p:ID}, {p:ID:1}, {p:ID:2}
        slots = [key_slot(ProductKeys(bench.PREFIX, product_id, b).stock.encode()) for b in range(buckets)]
        assert masters == [owner(slot) for slot in slots]


def test_node_counters_come_from_info_and_subtract():
    before = bench.NodeStats.from_info({}, {"used_cpu_user": "1.5", "used_cpu_sys": "0.5"})
    after = bench.NodeStats.from_info(
        {"cmdstat_evalsha": {"calls": 1000, "usec": 20000}}, {"used_cpu_user": "2.0", "used_cpu_sys": "0.6"}
    )
    delta = after.minus(before)
    assert (delta.calls, delta.usec) == (1000, 20000)
    assert delta.cpu == pytest.approx(0.6)


def _phase(buckets, path, count, masters, seconds=2.0):
    stats = {node: bench.NodeStats(calls, usec, cpu) for node, (calls, usec, cpu) in masters.items()}
    return bench.Phase(buckets, path, seconds, {bench.EXPECTED[path]: count, "rebucket": 1}, stats, 1.0, 1.8)


def test_the_report_pools_rounds_and_divides_the_masters_work_by_their_calls():
    idle = (0, 0, 0.01)  # a master without calls: its cron's CPU is not counted
    phases = [
        _phase(1, "accept", 20_000, {"a": (20_000, 300_000, 0.8), "b": idle, "c": idle}),
        _phase(3, "accept", 30_000, {"a": (10_000, 150_000, 0.4), "b": (10_000, 150_000, 0.5), "c": (10_000, 0, 0.3)}),
        _phase(1, "accept", 24_000, {"a": (24_000, 360_000, 1.0), "b": idle, "c": idle}),
        _phase(3, "accept", 30_000, {"a": (10_000, 150_000, 0.4), "b": (10_000, 150_000, 0.5), "c": (10_000, 0, 0.3)}),
    ]
    k1, k3 = bench.summarize(phases)
    assert (k1.buckets, k1.per_s, k1.rounds_min, k1.rounds_max) == (1, 11_000, 10_000, 12_000)
    assert (k1.masters_used, k1.unexpected, k1.ratio) == (1, 2, None)
    assert k1.outcomes == {"reserved": 44_000, "rebucket": 2}
    assert k1.script_us_per_call == pytest.approx(15.0)
    assert k1.redis_cpu_us_per_call == pytest.approx(1.8e6 / 44_000)
    assert k1.capacity_per_master == pytest.approx(44_000 / 1.8)
    assert k1.busiest_master_cpu_share == pytest.approx(0.45)  # (0.8 / 2 + 1.0 / 2) / 2
    assert (k1.client_cores, k1.machine_cores) == (0.5, 1.8)
    assert k3.masters_used == 3 and k3.per_master_calls == {"a": 20_000, "b": 20_000, "c": 20_000}
    assert k3.ratio == pytest.approx(15_000 / 11_000)
    assert k3.busiest_master_cpu_share == pytest.approx(0.25)
    assert "K=" not in bench.render([k1, k3]) and "1.36" in bench.render([k1, k3])
