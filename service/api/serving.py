"""How every HTTP server of flashsale runs on granian: ``flashsale serve`` (the product), the
servers of the bench and of ``flashsale sale`` (:mod:`toolkit.bench.server`: the bare app;
:mod:`toolkit.bench.product_app`: the product with the no-op route) and the channel simulator
share :func:`serve_app`, and the two product servers share :func:`serve_api`, so what the bench
compares differs only in the app."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from service.environment_errors import ConfigError
from service.runtime import run_async
from service.settings import Settings

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client when it is first imported


@contextlib.contextmanager
def metrics_directory(enabled: bool) -> Iterator[None]:
    """prometheus_client's multiprocess directory for the granian workers (each is a process):
    ``PROMETHEUS_MULTIPROC_DIR`` when set (emptied first: values of an earlier run must not count),
    else a new temporary directory, removed on exit. Must run before prometheus_client is
    imported in this process or a worker."""
    if not enabled:
        yield
        return
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        for stale in Path(given).glob("*.db"):
            stale.unlink()
        yield
        return
    directory = tempfile.mkdtemp(prefix="flashsale-metrics-")
    os.environ[MULTIPROC_ENV] = directory
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(directory, ignore_errors=True)


SHARE_PORT_OPTION = "--share-port"  # flashsale serve's; the channel simulator has none


class PortInUse(ConfigError):
    """Another process listens on the port a server was asked to serve on."""


def require_free_port(host: str, port: int, *, share_option: str | None = None) -> None:
    """Refuse a port another process listens on. granian binds every worker's socket with
    ``SO_REUSEPORT``, so the kernel would let a second server onto a busy port and split the
    connections between the two; a probe bound without it (``SO_REUSEADDR`` only, so a port
    whose old connections linger in TIME_WAIT counts as free) fails where anyone listens. Port 0
    (any free port) is not checked. The probe is closed before granian binds: two servers
    started in the same instant can still both get in.

    Raises:
        PortInUse: one line naming the address and, where the command has one
            (``share_option``), the option that asks for sharing.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            remedies = "stop it or choose another --port"
            if share_option:
                remedies = f"stop it, choose another --port, or {share_option} to share the port with it"
            raise PortInUse(
                f"--port {port}: address already in use on {host} (another server listens there: {remedies})"
            ) from None


async def shards_short(settings: Settings, workers: int) -> str | None:
    """Why ``workers`` more API workers cannot start on ``settings``'s key prefix (fewer free
    order-number shards than workers, one line), or None (also when Redis does not answer)."""
    from service.adapters.redis.stores import make_stores
    from service.domain.order_numbers.format import REDIS_SHARDS
    from service.domain.order_numbers.minter import leased_shards
    from service.failures import is_outage

    store = make_stores(settings)
    try:
        leased = await leased_shards(store)
    except Exception as exc:
        if is_outage(exc):
            return None  # Redis is away: each worker finds out once it connects
        raise
    finally:
        await store.aclose()
    free = REDIS_SHARDS - leased
    if free >= workers:
        return None
    return (
        f"{workers} workers need {workers} order-number shards, {free} of {REDIS_SHARDS} are free "
        f"({leased} leased by running API workers of key prefix {settings.redis.key_prefix!r}): "
        f"at most {REDIS_SHARDS} API worker processes per key prefix"
    )


FILES_KEPT = 256
"""Open files a worker keeps for its own use (store connections, logs, metrics files)."""


def connections_per_worker() -> int:
    """granian's ``backpressure``: how many connections a worker serves at once. granian holds a
    permit per connection, idle keep-alive ones included, and a connection past the last permit
    waits unanswered in the listen backlog; its default (backlog / workers, 2,048 here) left
    half of 8,192 polling buyers' connections waiting until their client gave up. The worker's
    open-file limit (``ulimit -n``) less :data:`FILES_KEPT` is the cap instead."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65_536
    return max(128, soft - FILES_KEPT)


def serve_app(
    target: str, host: str, port: int, workers: int, *, share_port: bool = False, share_option: str | None = None
) -> str | None:
    """Serve the ASGI app factory ``target`` (``module:factory``) on granian until stopped:
    uvloop, a 4096-connection backlog, every connection the process may open served at once
    (:func:`connections_per_worker`), no access log of granian's own (the app writes one),
    failed workers respawned; a port another process listens on is refused
    (:func:`require_free_port`, naming ``share_option`` where the command has one) unless
    ``share_port``. ``flashsale serve`` runs it inside :func:`metrics_directory`, so
    that its workers share one multiprocess metrics directory. Returns None, or why a worker
    stopped the server (:mod:`service.api.no_shard`: every order-number shard leased).

    Raises:
        PortInUse: the port is busy and ``share_port`` was not given.
    """
    if not share_port:
        require_free_port(host, port, share_option=share_option)
    from granian import Granian
    from granian.constants import Interfaces, Loops

    from service.api.no_shard import SERVE_PID_ENV, stopped_for
    from service.log_setup import granian_logging

    os.environ[SERVE_PID_ENV] = str(os.getpid())
    server = Granian(
        target,
        factory=True,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        workers=workers,
        loop=Loops.uvloop,
        backlog=4096,
        backpressure=connections_per_worker(),
        log_access=False,
        log_dictconfig=granian_logging(),
        respawn_failed_workers=True,
    )
    try:
        server.serve()
    except SystemExit:  # granian exits 1 when workers crashed: a worker's reason comes first
        reason = stopped_for(os.getpid())
        if reason is None:
            raise
        return reason
    return stopped_for(os.getpid())


def serve_api(
    settings: Settings,
    target: str,
    host: str,
    port: int,
    workers: int,
    warn: Callable[[str], None],
    *,
    share_port: bool = False,
) -> str | None:
    """Serve the purchase API factory ``target`` as ``flashsale serve`` does: inside one
    multiprocess metrics directory, after asking Redis, RabbitMQ and MySQL once (``warn`` gets
    one line per store that does not answer: the API starts all the same, not ready until it
    answers) and checking that ``workers`` order-number shards are free. Returns None, or why
    the server did not start or stopped (:func:`shards_short`, :func:`serve_app`).

    Raises:
        PortInUse: the port is busy and ``share_port`` was not given (asked first, before the stores).
        DependencyUnreachable: a store refuses as configured (wrong credentials, unknown database).
    """
    if not share_port:
        require_free_port(host, port, share_option=SHARE_PORT_OPTION)
    # The multiprocess directory first: the check imports prometheus_client, which reads it once.
    with metrics_directory(settings.metrics.enabled):
        from service.startup import report_dependencies

        for away in run_async(report_dependencies(settings)):
            warn(f"flashsale: {away}; starting anyway, not ready until it answers")
        return run_async(shards_short(settings, workers)) or serve_app(
            target, host, port, workers, share_port=share_port, share_option=SHARE_PORT_OPTION
        )
