"""The sale's verdict (toolkit/sale/verdict.py): server- or client-bound from what a wave cost,
and the merged trail's completeness check (toolkit/sale/swarm.py)."""

from __future__ import annotations

import msgspec

from toolkit.sale.crowd import Behaviour, Buyer, Trail
from toolkit.sale.facts import WaveLoad
from toolkit.sale.plan import Answer
from toolkit.sale.swarm import read_trail
from toolkit.sale.swarm_plan import CrowdPlan, Sent, SwarmPlan, TrailChunk, WorkerDone
from toolkit.sale.verdict import crowd_section, verdict, wave_figures


def _load(**changes: object) -> WaveLoad:
    base = {
        "label": "purchase",
        "requests": 10_000,
        "seconds": 10.0,
        "workers": 2,
        "hosts": {"box (127.0.0.1)": 10_000},
        "client_cpu": 2.5,
        "client_busy": 20.0,
        "server_cpu": 3.0,
        "lags": [0.001] * 100,
        "loop_lags": [0.002] * 100,
        "duplicates": 0,
        "missing": 0,
        "latency_p99": 0.2,
        "load_average": 1.0,
    }
    return WaveLoad(**{**base, **changes})  # type: ignore[arg-type]


def test_cpu_per_request_and_shares():
    figures = wave_figures(_load(), cores=2)
    assert figures["client_cpu_us_per_request"] == 250.0 and figures["server_cpu_us_per_request"] == 300.0
    assert figures["client_busy_share"] == 0.125
    assert figures["box_cpu_share"] == {"client": 0.125, "server": 0.15}
    assert figures["answers_per_second"] == 1000.0
    assert wave_figures(_load(server_cpu=None), cores=2)["server_cpu_us_per_request"] is None


def test_a_crowd_with_headroom_leaves_the_verdict_to_the_server():
    said = verdict(wave_figures(_load(), cores=2), cores=2)
    assert said["bound"] == "server" and said["line"].startswith("server-bound")
    assert "shared this 2-core box" in said["line"] and "Load average" not in said["line"]


def test_busy_workers_make_it_client_bound():
    said = verdict(wave_figures(_load(client_cpu=17.0), cores=2), cores=2)
    assert said["bound"] == "client" and "busy 85%" in said["line"]


def test_a_late_event_loop_makes_it_client_bound_only_against_the_answers_own_latency():
    late = [0.3] * 100
    assert verdict(wave_figures(_load(loop_lags=late), cores=2), cores=2)["bound"] == "client"
    # 300 ms late against answers that took 5 s: the server held the buyers up
    assert verdict(wave_figures(_load(loop_lags=late, latency_p99=5.0), cores=2), cores=2)["bound"] == "server"


def test_waiting_for_a_connection_is_reported_not_weighed():
    # every connection busy waiting for a slow server: the requests queue in the crowd
    figures = wave_figures(_load(lags=[20.0] * 100, latency_p99=30.0), cores=2)
    assert figures["lag_due_to_sent_ms"]["p99"] == 20_000.0
    assert verdict(figures, cores=2)["bound"] == "server"


def test_a_loaded_box_is_named_and_other_hosts_are_not_a_shared_box():
    loaded = verdict(wave_figures(_load(load_average=9.5), cores=2), cores=2)
    assert "Load average 9.5 on 2 cores" in loaded["line"]
    hosts = {"box (127.0.0.1)": 5000, "other (10.0.0.2)": 5000}
    assert "shared this" not in verdict(wave_figures(_load(hosts=hosts), cores=2), cores=2)["line"]


def test_the_main_wave_is_the_purchase_wave_or_the_crowd():
    section = crowd_section((_load(label="no-op"), _load(label="purchase"), _load(label="resale")))
    assert (
        section is not None
        and section["main_wave"] == "purchase"
        and list(section["waves"])
        == [
            "no-op",
            "purchase",
            "resale",
        ]
    )
    assert crowd_section(()) is None


def _write(directory, chunks: list[TrailChunk], done: list[WorkerDone]) -> None:
    with (directory / "trail.msgpack").open("wb") as trail:
        for chunk in chunks:
            data = msgspec.msgpack.encode(chunk)
            trail.write(len(data).to_bytes(8, "big") + data)
    (directory / "done.jsonl").write_bytes(b"".join(msgspec.json.encode(d) + b"\n" for d in done))


def _sent(index: int) -> Sent:
    return Sent(index, Answer(409, "sold_out", None, None, 0.01, 100.0 + index), 99.0, 99.5)


def test_the_merged_trail_counts_every_request_once(tmp_path):
    chunks = [TrailChunk(0, [_sent(0), _sent(1)]), TrailChunk(1, [_sent(2)]), TrailChunk(0, [_sent(3)])]
    done = [WorkerDone(0, "a", 3, 0.1, 1.0, []), WorkerDone(1, "b", 1, 0.1, 1.0, [])]
    _write(tmp_path, chunks, done)
    run = read_trail(tmp_path, "purchase", 4)
    assert (run.duplicates, run.missing, run.requests) == (0, 0, 4)
    assert [answer.finished for answer in run.outcomes(4)] == [100.0, 101.0, 102.0, 103.0]


def test_a_request_twice_or_missing_shows_in_the_trail(tmp_path):
    chunks = [TrailChunk(0, [_sent(0), _sent(1), _sent(1)])]
    _write(tmp_path, chunks, [WorkerDone(0, "a", 2, 0.1, 1.0, [])])
    run = read_trail(tmp_path, "purchase", 3)
    assert run.duplicates == 2  # index 1 twice, and one record more than the worker sent
    assert run.missing == 1  # index 2 never came back


def test_buyers_records_count_against_the_workers_counts(tmp_path):
    buyer = Buyer("crowd-0", Behaviour.HONEST, 0.5, None, 0.3)
    trail = Trail(buyer, arrived=100.0, lags=[0.0, 0.01, 0.02])
    _write(tmp_path, [TrailChunk(0, trails=[trail])], [WorkerDone(0, "a", 4, 0.1, 1.0, [])])
    run = read_trail(tmp_path, "crowd", 0)
    assert (run.requests, run.missing, run.duplicates) == (3, 1, 0)


def test_a_plan_spawns_one_user_per_lane_or_per_buyer():
    buyers = [Buyer(f"crowd-{n}", Behaviour(b), 0.0, None, 0.1) for n, b in enumerate(["honest", "scripted", "honest"])]
    crowd = SwarmPlan("crowd", "http://x", 10, crowd=CrowdPlan(1, True, buyers, {}, 60.0))
    assert crowd.user_counts() == {"HonestBuyer": 2, "ScriptedBuyer": 1}
    assert SwarmPlan("p", "http://x", 8, lanes=8, errands=[]).user_counts() == {"PlanBuyer": 0}
