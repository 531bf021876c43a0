"""The buyer's waiting page: ``GET /queue/{product_id}`` (HTML, no asset from elsewhere).

The page is the same bytes for every product and buyer: it reads the product id from its path
and the buyer's JWT from the URL fragment (``#token=...``), which browsers never send to a
server, so the token reaches neither this route nor the access log. Its script then calls the
queue and purchase routes with the token as a bearer header (docs/API.md, "Waiting room").
"""

from __future__ import annotations

from importlib.resources import files

from litestar import Controller, MediaType, Response, get

from service.api.params import ProductIdPath

_PAGE = files("service.api.static").joinpath("queue.html").read_bytes()

# Everything the page loads comes from this origin; the inline script and style are the page's own.
_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
}


class WaitingPageController(Controller):
    tags = ["waiting room"]

    @get("/queue/{product_id:int}", exclude_from_auth=True, include_in_schema=False, media_type="text/html")
    async def page(self, product_id: ProductIdPath) -> Response[bytes]:
        """The waiting page of ``product_id`` (open it as ``/queue/ID#token=<buyer JWT>``)."""
        return Response(_PAGE, media_type=MediaType.HTML, headers=_HEADERS)
