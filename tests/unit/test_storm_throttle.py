"""Log lines a lost store makes every request repeat: one a second, with the count dropped."""

from __future__ import annotations

import json

import pytest
import structlog

from service.log_setup import StormThrottle, configure_logging


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pass(throttle: StormThrottle, name: str) -> dict | None:
    try:
        return throttle(None, "warning", {"event": name})
    except structlog.DropEvent:
        return None


def test_one_line_a_second_per_event_then_the_count_of_the_dropped():
    clock = Clock()
    throttle = StormThrottle(frozenset({"reserve_failed", "publish_failed"}), seconds=1.0, clock=clock)
    passed = [_pass(throttle, "reserve_failed") for _ in range(500)]
    assert sum(line is not None for line in passed) == 1 and "suppressed" not in passed[0]
    assert _pass(throttle, "publish_failed") == {"event": "publish_failed"}  # its own budget
    assert _pass(throttle, "order_written") == {"event": "order_written"}  # not a storm event: untouched
    clock.now += 0.5
    assert _pass(throttle, "reserve_failed") is None
    clock.now += 0.6
    assert _pass(throttle, "reserve_failed") == {"event": "reserve_failed", "suppressed": 500}
    clock.now += 5
    assert _pass(throttle, "reserve_failed") == {"event": "reserve_failed"}


def test_the_process_logger_throttles_a_storm(capsys: pytest.CaptureFixture[str]):
    configure_logging("INFO")
    log = structlog.get_logger("storm-test")
    for n in range(300):
        log.warning("reserve_failed", request_id=f"r{n}", error="ConnectionError()")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert [line["event"] for line in lines].count("reserve_failed") == 1


def test_each_cause_of_one_event_has_its_own_budget():
    """Two causes of 503 at once (the queue and the stock service): each is told every second,
    so a window of either is never silent behind the other's lines."""
    clock = Clock()
    throttle = StormThrottle(frozenset({"unavailable_answered"}), seconds=1.0, clock=clock)

    def line(cause: str) -> dict | None:
        try:
            return throttle(None, "warning", {"event": "unavailable_answered", "cause": cause})
        except structlog.DropEvent:
            return None

    told = [(second, cause) for second in range(5) for cause in ("queue", "stock") if line(cause) is not None]
    assert told == [(0, "queue"), (0, "stock")]
    for second in range(1, 4):
        clock.now += 1.0
        assert [line(cause) is not None for cause in ("queue", "queue", "stock")] == [True, False, True], second
