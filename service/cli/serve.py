"""How every HTTP server of flashsale runs on granian: ``flashsale serve`` (the product) and the
bench's servers (:mod:`service.bench.server`: the bare app and the product) share
:func:`serve_app`, so what they compare differs only in the app."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

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


def serve_app(target: str, host: str, port: int, workers: int) -> None:
    """Serve the ASGI app factory ``target`` (``module:factory``) on granian until stopped:
    uvloop, a 4096-connection backlog, no access log of granian's own (the app writes one),
    failed workers respawned. ``flashsale serve`` runs it inside :func:`metrics_directory`, so
    that its workers share one multiprocess metrics directory."""
    from granian import Granian
    from granian.constants import Interfaces, Loops

    from service.log_setup import granian_logging

    Granian(
        target,
        factory=True,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        workers=workers,
        loop=Loops.uvloop,
        backlog=4096,
        log_access=False,
        log_dictconfig=granian_logging(),
        respawn_failed_workers=True,
    ).serve()
