"""The API's dependencies (Litestar DI): one provider per service a handler uses, each handing
out the object the worker built once at start-up (:func:`service.bootstrap.open_api`), so a
request constructs nothing (docs/ARCHITECTURE.md).

The worker opens its stores in the background (:class:`service.startup.BackgroundResources`):
until it has, every provider of :data:`SERVICES` raises :class:`Unavailable` (503
``unavailable``, which :mod:`service.api.openapi` documents for the routes that take one). The
providers do not cache (``use_cache``): what they hand out belongs to one lifespan of the app.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from litestar.di import Provide

from service.domain.errors import Unavailable
from service.failures import STORE_NAMES, Store
from service.startup import BackgroundResources

SERVICES = frozenset(
    {"purchases", "orders", "catalog", "realigner", "payments", "checkout", "publisher", "settings", "rooms"}
)
"""The dependencies held by the opened worker (:class:`service.bootstrap.ApiWorker`'s fields of
the same names)."""

WORKER = "worker_resources"
"""The dependency of the readiness probe: the worker's opening, connected or not."""


class WorkerSlot:
    """Where the app's lifespan puts the worker's opening (None outside the lifespan)."""

    __slots__ = ("opening",)

    def __init__(self) -> None:
        self.opening: BackgroundResources | None = None


def providers(slot: WorkerSlot) -> dict[str, Provide]:
    """``{name: Provide}`` for every service of :data:`SERVICES` and for :data:`WORKER`: plain
    functions run on the event loop (``sync_to_thread=False``), one attribute read each."""
    dependencies = {name: Provide(_held(slot, name), sync_to_thread=False) for name in SERVICES}
    dependencies[WORKER] = Provide(lambda: slot.opening, sync_to_thread=False)
    return dependencies


def connecting_detail(reachable: dict[Store, bool]) -> str:
    """The detail of a ``503`` while the worker connects: the stores that did not answer its last
    attempt, by name (``reachable``: :attr:`BackgroundResources.reachable`)."""
    away = [STORE_NAMES[store] for store, answered in reachable.items() if not answered]
    waiting = " and ".join(away) if away else "its stores"
    return f"The service is still connecting to {waiting}; retry shortly."


def _held(slot: WorkerSlot, name: str) -> Any:
    pick = attrgetter(name)

    def provide() -> Any:
        opening: BackgroundResources = slot.opening  # type: ignore[assignment]  # set for the whole lifespan
        if opening.current is None:
            raise Unavailable(connecting_detail(opening.reachable))
        return pick(opening.current)

    provide.__name__ = f"provide_{name}"
    return provide
