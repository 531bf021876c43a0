"""The framework's ceiling: a minimal Litestar app with the purchase route's body and nothing else.

``POST /noop`` decodes ``{"product_id": int, "quantity": int}`` with msgspec and answers 202
``{"status": "noop"}``: no auth, no DI, no logging, no I/O. Served by granian with the same
settings as ``flashsale serve`` (:mod:`toolkit.bench.server`), its start-up heap frozen as the
API's is (:func:`service.runtime.freeze_startup_heap`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from litestar import Litestar, post
from litestar.params import JSONBody

from service.runtime import freeze_startup_heap


class NoopBody(msgspec.Struct, forbid_unknown_fields=True):
    """The purchase body's shape (``quantity`` in units)."""

    product_id: int
    quantity: int


@post("/noop", status_code=202)
async def noop(data: JSONBody[NoopBody]) -> dict[str, str]:
    return {"status": "noop"}


def create_app() -> Litestar:
    """The bare app (a factory, as granian loads ``service.api.app:create_app``)."""

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        freeze_startup_heap()
        yield

    return Litestar(route_handlers=[noop], openapi_config=None, lifespan=[lifespan])
