"""``make chaos`` draws its faults from a seed (tests/faults/chaos.py): the same seed, the same
schedule; never two faults on one resource at once."""

from __future__ import annotations

from tests.faults.chaos import QUIET_END_SECONDS, schedule


def test_the_seed_reproduces_the_schedule() -> None:
    assert schedule(7, 20) == schedule(7, 20)
    assert schedule(7, 20) != schedule(8, 20)


def test_faults_on_one_resource_never_overlap_and_the_last_minute_is_quiet() -> None:
    for seed in range(20):
        faults = schedule(seed, 20)
        assert len(faults) > 20
        assert max(fault.at for fault in faults) < 20 * 60 - QUIET_END_SECONDS
        ends: dict[str, float] = {}
        for fault in faults:
            assert ends.get(fault.resource, -1.0) < fault.at, (seed, fault)
            ends[fault.resource] = fault.at + fault.seconds
        assert len({fault.kind for fault in faults}) == 5
