"""A granian worker that cannot lease an order-number shard stops the whole server, once.

Every Redis shard (:data:`~service.domain.order_numbers.minter.REDIS_SHARDS`) leased by other processes is
not a crash to retry: a respawned worker finds them leased again (granian would respawn it in a
crash loop). So the worker says so in one log line, leaves the reason for ``flashsale serve``
(a file named after the server's process id), asks the granian main process to stop (SIGTERM,
its graceful shutdown) and exits with :data:`EXIT_NO_SHARD`; ``flashsale serve`` then prints
the reason and exits with the same code. Only under ``flashsale serve`` (``FLASHSALE_SERVE_PID``
names the worker's parent); anywhere else (tests, an embedding server) the error is raised.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import structlog

from service.domain.order_numbers.format import REDIS_SHARDS
from service.domain.order_numbers.minter import ShardsExhausted

EXIT_NO_SHARD = 3
"""Exit code of a worker, and of ``flashsale serve``, that found every order-number shard leased."""
SERVE_PID_ENV = "FLASHSALE_SERVE_PID"
"""Set by ``flashsale serve`` to its own process id, inherited by its granian workers."""

log = structlog.get_logger(__name__)


def reason_file(server_pid: int) -> Path:
    """Where a worker of the server ``server_pid`` leaves the reason it stopped the server."""
    return Path(tempfile.gettempdir()) / f"flashsale-serve-{server_pid}.no-shard"


def stop_server(exc: ShardsExhausted) -> None:
    """Log ``order_no_shards_exhausted`` once, and under ``flashsale serve`` stop the server and
    exit this worker with :data:`EXIT_NO_SHARD` (does not return then); else return (the caller
    raises ``exc``)."""
    log.error("order_no_shards_exhausted", shards=REDIS_SHARDS, error=str(exc))
    server_pid = os.getppid()
    if os.environ.get(SERVE_PID_ENV) != str(server_pid):
        return
    reason_file(server_pid).write_text(str(exc), encoding="utf-8")
    os.kill(server_pid, signal.SIGTERM)
    os._exit(EXIT_NO_SHARD)


def stopped_for(server_pid: int) -> str | None:
    """The reason a worker of ``server_pid`` stopped it (the file is removed), or None."""
    path = reason_file(server_pid)
    try:
        reason = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    path.unlink(missing_ok=True)
    return reason
