"""Waiting out a store outage: which errors are outages (and which are configuration), the
back-off, one log line per outage, and ``--watch`` loops that survive them."""

from __future__ import annotations

import asyncio

import pytest
import structlog
from aiormq.exceptions import AMQPConnectionError, ProbableAuthenticationError
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import OperationalError

from service import runtime
from service.failures import PublishFailed, is_outage, outage_of
from service.runtime import Backoff, OutageLog, watch
from service.startup import DependencyUnreachable


class _MySQLError(Exception):
    def __init__(self, errno: int) -> None:
        super().__init__(errno, "message")


def _mysql(errno: int) -> OperationalError:
    return OperationalError("SELECT 1", {}, _MySQLError(errno))


@pytest.mark.parametrize(
    ("error", "store"),
    [
        (RedisConnectionError("Error 111 connecting"), "Redis"),
        (_mysql(2003), "MySQL"),
        (_mysql(2013), "MySQL"),
        (_mysql(1053), "MySQL"),
        (AMQPConnectionError("refused"), "RabbitMQ"),
        (PublishFailed("broker connection is down"), "RabbitMQ"),
        (ConnectionRefusedError(111, "refused"), "a store"),
        (TimeoutError(), "a store"),
    ],
)
def test_outages_name_their_store(error, store):
    assert outage_of(error) == store and is_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        _mysql(1045),  # access denied
        _mysql(1049),  # unknown database
        _mysql(1062),  # a duplicate key: no connection problem at all
        RedisAuthenticationError("WRONGPASS"),
        ProbableAuthenticationError("ACCESS_REFUSED"),
        ValueError("a bug"),
    ],
)
def test_configuration_and_bugs_are_no_outage(error):
    assert outage_of(error) is None


def test_the_cause_of_a_one_line_error_counts():
    try:
        try:
            raise _mysql(2003)
        except OperationalError as exc:
            raise DependencyUnreachable("FLASHSALE_DB__URL: cannot reach MySQL") from exc
    except DependencyUnreachable as wrapped:
        assert outage_of(wrapped) == "MySQL"
    try:
        try:
            raise _mysql(1045)
        except OperationalError as exc:
            raise DependencyUnreachable("FLASHSALE_DB__URL: cannot reach MySQL") from exc
    except DependencyUnreachable as wrapped:
        assert outage_of(wrapped) is None


@pytest.fixture(autouse=True)
def fresh_runtime_logger(monkeypatch):
    """A fresh logger for :mod:`service.runtime`: its module logger caches its processors on
    first use after ``configure_logging`` (an earlier test in the same process may have used it),
    and a cached logger does not reach ``capture_logs``."""
    monkeypatch.setattr(runtime, "log", structlog.get_logger(runtime.__name__))


def test_backoff_doubles_to_its_cap_and_resets():
    backoff = Backoff(first=0.5, cap=4.0)
    delays = [backoff.next() for _ in range(6)]
    for delay, nominal in zip(delays, [0.5, 1, 2, 4, 4, 4], strict=True):
        assert nominal * 0.8 <= delay <= nominal * 1.2
    backoff.reset()
    assert backoff.next() <= 0.6


def test_an_outage_is_two_lines_however_many_failures():
    with structlog.testing.capture_logs() as logs:
        outage = OutageLog("dependency", process="test")
        for _ in range(50):
            outage.failed(RedisConnectionError("down"))
        outage.recovered()
        outage.recovered()  # no outage: nothing to say
    assert [entry["event"] for entry in logs] == ["dependency_failing", "dependency_recovered"]
    assert logs[1]["failures"] == 50 and logs[0]["process"] == "test"


async def test_a_watch_pass_that_meets_an_outage_is_tried_again():
    results: list[str] = []
    script = iter(["ok", "down", "down", "down", "ok", "stop"])

    async def one_pass() -> None:
        step = next(script)
        if step == "down":
            raise RedisConnectionError("Error 111")
        if step == "stop":
            raise asyncio.CancelledError
        results.append(step)

    with structlog.testing.capture_logs() as logs, pytest.raises(asyncio.CancelledError):
        await watch(0.01, one_pass, survive=is_outage, event="test_pass")
    assert results == ["ok", "ok"]
    assert [entry["event"] for entry in logs] == ["test_pass_failing", "test_pass_recovered"]


async def test_a_watch_pass_that_fails_otherwise_ends_the_loop():
    async def one_pass() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        await watch(0.01, one_pass, survive=is_outage)


async def test_a_single_pass_is_not_retried():
    async def one_pass() -> None:
        raise RedisConnectionError("Error 111")

    with pytest.raises(RedisConnectionError):
        await watch(None, one_pass, survive=is_outage)
