"""How every HTTP server of flashsale runs on granian: ``flashsale serve`` (the product) and the
bench's servers (:mod:`service.bench.server`: the bare app and the product) share
:func:`serve_app`, so what they compare differs only in the app."""

from __future__ import annotations


def serve_app(target: str, host: str, port: int, workers: int) -> None:
    """Serve the ASGI app factory ``target`` (``module:factory``) on granian until stopped:
    uvloop, a 4096-connection backlog, no access log, failed workers respawned."""
    from granian import Granian
    from granian.constants import Interfaces, Loops

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
        respawn_failed_workers=True,
    ).serve()
