"""A second ``flashsale serve`` on a port the first still listens on: granian binds with
SO_REUSEPORT, so without a check the kernel would share the port and a forgotten old server
would silently take part of the traffic. Refused with one line and exit code 2, unless
``--share-port`` asks for sharing."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from tests.support import api_ready, eventually, flashsale_process, run_flashsale
from toolkit.sale.isolation import free_port

pytestmark = pytest.mark.slow  # starts server processes


async def test_a_second_server_on_a_busy_port_is_refused(settings):
    port = free_port()
    ready = f"http://127.0.0.1:{port}/api/v1/health/ready"
    async with flashsale_process(settings, ready, "serve", "--port", str(port), "--workers", "1") as first:
        second = await asyncio.to_thread(run_flashsale, settings, "serve", "--port", str(port), "--workers", "1")
        assert second.returncode == 2, (second.stdout, second.stderr)
        assert second.stderr.strip().splitlines() == [
            f"flashsale: configuration error: --port {port}: address already in use on 127.0.0.1 (another "
            f"server listens there: stop it, choose another --port, or --share-port to share the port with it)"
        ]
        assert first.poll() is None
        async with httpx.AsyncClient() as http:
            assert (await http.get(ready)).status_code == 200


async def test_share_port_lets_a_second_server_take_part(settings):
    """With --share-port the second server starts and listens too: once the first is stopped,
    the port answers again (the second server)."""
    port = free_port()
    ready = f"http://127.0.0.1:{port}/api/v1/health/ready"
    args = ("serve", "--port", str(port), "--workers", "1")
    async with contextlib.AsyncExitStack() as first:
        await first.enter_async_context(flashsale_process(settings, ready, *args))
        async with flashsale_process(settings, ready, *args, "--share-port") as second:
            await first.aclose()  # SIGTERM to the first, waited for
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                await eventually(lambda: api_ready(http))
            assert second.poll() is None
