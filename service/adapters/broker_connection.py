"""Connections to RabbitMQ: one node, or the nodes of a cluster (``FLASHSALE_AMQP__URL`` and
``FLASHSALE_AMQP__FAILOVER_URLS``; docs/OPERATIONS.md, "A RabbitMQ cluster").

Every connection asks for the heartbeat of ``FLASHSALE_AMQP__HEARTBEAT_SECONDS`` (unless its URL
names one), so the broker drops the connection of a process that stopped answering and hands
its unacknowledged deliveries to another consumer. A long-lived connection is a
:class:`FailoverConnection`: aio-pika's robust connection over every address, which makes each
connection attempt (the first, and each one after a lost connection) at the next address in
turn. A node that goes away thus costs its clients one reconnect to the next node, without a
load balancer in front of the cluster.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aio_pika.robust_connection import RobustConnection
from yarl import URL

from service.runtime import OutageLog, when_reachable
from service.settings import AMQPSettings

log = structlog.get_logger(__name__)

RECONNECT_SECONDS = 1.0
"""Least time between two connection attempts of a robust connection (aio-pika's default is 5 s,
and it counts from the last successful connect as well: a node lost soon after a connect kept
its clients away from the other nodes for that long)."""


@contextlib.contextmanager
def quiet_connect_logs() -> Iterator[None]:
    """While a first connect is attempted: aiormq and aio-pika log every refused connect as an
    error followed by "Reconnecting after 5 seconds" (although a first connect is not retried by
    them); the callers that wait for the broker say so themselves, once per outage."""
    loggers = [logging.getLogger("aiormq"), logging.getLogger("aio_pika")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def broker_addresses(settings: AMQPSettings) -> list[URL]:
    """:meth:`AMQPSettings.urls`, each with the heartbeat of the settings unless it names one."""
    addresses = []
    for url in settings.urls():
        address = URL(url)
        if "heartbeat" not in address.query:
            address = address.update_query(heartbeat=settings.heartbeat_seconds)
        addresses.append(address)
    return addresses


def _where(address: URL) -> str:
    return f"{address.host}:{address.port}"


class FailoverConnection(RobustConnection):
    """A robust connection over ``addresses`` (nodes of one cluster: same credentials, virtual host
    and queues), the first attempt at ``addresses[first]``, every later one at the next address
    in turn; a connection that is up stays where it is.

    aio-pika reads ``url`` exactly once per connection attempt (``Connection.connect``), so
    ``url`` is a property that hands out the next address on each read;
    tests/integration/availability/test_broker_failover.py holds aio-pika to that."""

    def __init__(self, addresses: Sequence[URL], first: int = 0, **kwargs: Any) -> None:
        self._addresses = list(addresses)
        self._next = first
        self._current = self._addresses[first % len(self._addresses)]
        kwargs.setdefault("reconnect_interval", RECONNECT_SECONDS)
        super().__init__(self._current, **kwargs)
        self._next = first  # Connection.__init__ read the query of the first address

    @property
    def url(self) -> URL:
        """The address of the connection attempt being made (the next in turn)."""
        self._current = self._addresses[self._next % len(self._addresses)]
        self._next += 1
        return self._current

    @url.setter
    def url(self, value: URL) -> None:  # aio-pika sets it in __init__ (and on update_secret: unused here)
        pass

    @property
    def address(self) -> str:
        """``host:port`` of the node of the current (or last) connection attempt."""
        return _where(self._current)

    def __str__(self) -> str:  # aio-pika's reads url
        return str(self._current.with_password("******") if self._current.password else self._current)

    async def _on_connected(self) -> None:
        await super()._on_connected()
        if len(self._addresses) > 1:
            log.info("broker_connected", node=self.address)


async def connect_robust(settings: AMQPSettings) -> AbstractRobustConnection:
    """A :class:`FailoverConnection` over :func:`broker_addresses`, its first connect tried at
    each address in turn (every attempt bounded by ``confirm_timeout``).

    Raises:
        aio_pika.exceptions.AMQPConnectionError: (or another connection error) no node answered;
            the last node's failure.
    """
    addresses = broker_addresses(settings)
    failure: BaseException | None = None
    for first in range(len(addresses)):
        connection = FailoverConnection(addresses, first)
        try:
            await connection.connect(timeout=settings.confirm_timeout)
        except CONNECTION_EXCEPTIONS as exc:
            failure = exc
            with contextlib.suppress(*CONNECTION_EXCEPTIONS):
                await connection.close()
            continue
        return connection
    assert failure is not None
    raise failure


async def connect_once(settings: AMQPSettings) -> AbstractConnection:
    """A plain connection (not robust: for one-shot work) to the first node that answers, each
    tried in turn within ``confirm_timeout``.

    Raises:
        aio_pika.exceptions.AMQPConnectionError: (or another connection error) no node answered.
    """
    failure: BaseException | None = None
    for address in broker_addresses(settings):
        try:
            return await aio_pika.connect(address, timeout=settings.confirm_timeout)
        except CONNECTION_EXCEPTIONS as exc:
            failure = exc
    assert failure is not None
    raise failure


async def connect_when_up(settings: AMQPSettings, purpose: str) -> AbstractRobustConnection:
    """A robust connection (:func:`connect_robust`), waiting for the broker as long as it takes:
    aio-pika's robust connection reconnects by itself only after a first connect succeeded
    (``fail_fast``: the first failure is raised), so the first one is tried again here with
    back-off (:func:`service.runtime.when_reachable`: 0.5 s doubling to 5 s), with one log line
    when the wait begins and one when it ends (``purpose`` names the connection in them). Cancel
    to give up."""

    async def connect() -> AbstractRobustConnection:
        with quiet_connect_logs():
            return await connect_robust(settings)

    connection = await when_reachable(
        connect,
        waiting=OutageLog("broker_connect", purpose=purpose),
        survive=lambda exc: isinstance(exc, CONNECTION_EXCEPTIONS),
    )
    assert connection is not None  # no stop event: only a connection ends the wait
    return connection
