"""Every route of the app answers OPTIONS and HEAD without a 5xx, with or without a token, and
OPTIONS lists every method of its path in ``Allow`` (RFC 9110 section 10.2.1). Walks the app's own
route list, so a route added later is covered without touching this test."""

from __future__ import annotations

import re

import pytest

from service.api.app import create_app

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")
_SAMPLES = {"order_no": "FS202611300129481500000127", "product_id": "1", "path": "x"}


def _concrete(path: str) -> str:
    return _PARAM.sub(lambda m: _SAMPLES.get(m.group(1), "1"), path)


def _routes(settings):
    app = create_app(settings)
    return [(route.path, frozenset(route.methods)) for route in app.routes if hasattr(route, "methods")]


@pytest.fixture(scope="module")
def routes(settings):
    return _routes(settings)


@pytest.mark.parametrize("who", ["anonymous", "buyer", "admin"])
async def test_options_and_head_on_every_route(client, token, routes, who):
    headers = {} if who == "anonymous" else token("walker", admin=who == "admin")
    assert any("/admin/" in path for path, _ in routes)
    for path, methods in routes:
        url = _concrete(path)
        options = await client.options(url, headers=headers)
        assert options.status_code == 204, (path, options.status_code, options.text)
        assert set(options.headers["allow"].split(", ")) == set(methods), (path, options.headers["allow"])
        head = await client.head(url, headers=headers)
        assert head.status_code < 500, (path, head.status_code)
        if "HEAD" not in methods:
            assert head.status_code in (401, 405), (path, head.status_code)


async def test_options_of_orders_lists_get_and_post(client):
    response = await client.options("/api/v1/orders")
    assert response.headers["allow"] == "GET, OPTIONS, POST"
