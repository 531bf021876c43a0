"""The failure vocabulary: what a store's failure means to the rest of the service.

Each adapter (Redis, MySQL, RabbitMQ) translates its driver's exceptions into these types at its
own boundary, once; the domain and the edges catch only these, never a driver's exception
(docs/ARCHITECTURE.md, "Failure vocabulary").
"""

from __future__ import annotations

from typing import Literal

Store = Literal["redis", "mysql", "rabbitmq"]


class StoreFailure(Exception):
    """A store did not do what was asked; the subclass says what the caller may assume."""


class StoreUnavailable(StoreFailure):
    """``store`` could not be reached or did not answer in time. The call may or may not have
    taken effect (a reply lost on the wire): callers that wrote compensate or leave it to
    realignment."""

    def __init__(self, store: Store, detail: str = "") -> None:
        super().__init__(f"{store} unavailable" + (f": {detail}" if detail else ""))
        self.store: Store = store
        self.detail = detail


class TransientConflict(StoreFailure):
    """MySQL chose this transaction as a deadlock victim or its lock wait timed out (1213, 1205):
    nothing was written; running the whole transaction again may succeed."""


class DuplicateKey(StoreFailure):
    """An insert met a UNIQUE index (MySQL error 1062); ``key`` names the index when known."""

    def __init__(self, key: str | None, detail: str = "") -> None:
        super().__init__(detail or f"duplicate key {key}")
        self.key = key
