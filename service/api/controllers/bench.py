"""``POST /api/v1/bench/noop``: the framework's ceiling for the benchmark in docs/BENCHMARKS.md.

Same server, same JWT auth and JSON body decoding as ``POST /orders``, and nothing else. Mounted
only when ``FLASHSALE_BENCH_ROUTES=true`` (``flashsale sale`` turns it on for its own API).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post

from service.api.auth import User
from service.api.body import decode_body
from service.api.controllers.orders import PurchaseRequest
from service.api.media import JSON_BODY_OPT


class BenchController(Controller):
    path = "/bench"
    tags = ["bench"]
    include_in_schema = False

    @post("/noop", status_code=202, opt={JSON_BODY_OPT: True})
    async def noop(self, request: Request[User, Any, Any]) -> dict[str, str]:
        await decode_body(request, PurchaseRequest)
        return {"status": "noop"}
