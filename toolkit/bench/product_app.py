"""The product API with the benchmark's no-op route, ``POST /api/v1/bench/noop``: the framework's
ceiling of ``flashsale bench`` (its ``product_noop`` rows) and of ``flashsale sale`` (its no-op
wave), see docs/BENCHMARKS.md.

The route does the purchase route's framework work and nothing else: the same app (middleware,
hooks, JWT auth, problem details, access log and metrics), the same JSON body decoding of
``PurchaseRequest``. It lives here, not in :mod:`service.api`, so the product API has no
benchmark route and no setting that mounts one. Served as ``flashsale serve`` serves the product
(:func:`toolkit.bench.server.main` with ``--api``), so the two differ only in this route.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Litestar, Request, Router, post

from service.api.app import create_app as create_product_app
from service.api.auth import User
from service.api.body import decode_body
from service.api.controllers.orders import PurchaseRequest
from service.api.media import JSON_BODY_OPT
from service.settings import Settings


class BenchController(Controller):
    path = "/bench"
    tags = ["bench"]
    include_in_schema = False

    @post("/noop", status_code=202, opt={JSON_BODY_OPT: True})
    async def noop(self, request: Request[User, Any, Any]) -> dict[str, str]:
        await decode_body(request, PurchaseRequest)
        return {"status": "noop"}


def create_app(settings: Settings | None = None) -> Litestar:
    """The product API (:func:`service.api.app.create_app`) with :class:`BenchController` under
    ``/api/v1``, registered after the app is built so that the app-level middleware, hooks, auth
    and exception handlers apply to it as to the purchase route."""
    app = create_product_app(settings)
    app.register(Router("/api/v1", route_handlers=[BenchController]))
    return app
