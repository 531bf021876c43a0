"""The API server process (granian): its workers survive being killed."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from tests.support import eventually, start_serve
from toolkit.sale.isolation import free_port

pytestmark = pytest.mark.slow


async def test_a_killed_api_worker_is_replaced(settings):
    """Guards: a killed granian worker was not respawned and the API lost capacity for good."""
    port = free_port()
    serve = start_serve(settings, port, workers=2)
    url = f"http://127.0.0.1:{port}/api/v1/health/ready"

    async def ready():
        try:
            async with httpx.AsyncClient() as http:
                return (await http.get(url)).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        await eventually(ready, timeout=60, interval=0.25)
        workers = _children(serve.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        await eventually(lambda: _replaced(serve.pid, workers[0]), timeout=60, interval=0.25)
        await eventually(ready, timeout=60, interval=0.25)
        assert serve.poll() is None
    finally:
        # SIGKILL: after a respawn granian's graceful stop can hang (the test is about the respawn).
        os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout.split()
    return sorted(int(p) for p in found)


async def _replaced(pid: int, dead: int) -> bool:
    children = _children(pid)
    return len(children) == 2 and dead not in children
