"""Servers under test: started as subprocesses, each in its own session, measured from ``/proc``.

Every HTTP server runs on granian through :func:`service.api.serving.serve_app`, as ``flashsale serve``
does, so the bare app and the product differ only in the app; the product (with the no-op route,
:mod:`toolkit.bench.product_app`) is served through :func:`service.api.serving.serve_api`, the
start-up of ``flashsale serve`` itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service.api.serving import serve_api, serve_app
from toolkit.bench.procstat import process_tree

READY_TIMEOUT = 60.0  # seconds for a server to answer its readiness probe
STOP_TIMEOUT = 15.0  # seconds after SIGTERM before SIGKILL


class ServerFailed(RuntimeError):
    """A subprocess exited or never became ready; the message names its log file."""


class Child:
    """One subprocess (a server or a consumer) in a session of its own, output to ``log``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def pids(self) -> list[int]:
        """The process and its live descendants (granian's workers)."""
        return process_tree(self.process.pid)

    def check_alive(self) -> None:
        """Raises ServerFailed when the process has exited."""
        if self.process.poll() is not None:
            raise ServerFailed(f"{self.name} exited with {self.process.returncode}; see {self.log}")

    async def wait_ready(self, method: str, url: str, expect: int, body: bytes | None = None) -> None:
        """Poll ``method url`` until it answers ``expect``.

        Raises:
            ServerFailed: the process exited, or no such answer within :data:`READY_TIMEOUT` s.
        """
        deadline = time.monotonic() + READY_TIMEOUT
        headers = {"Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            while True:
                self.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.request(method, url, content=body, headers=headers)).status_code == expect:
                        return
                if time.monotonic() > deadline:
                    raise ServerFailed(f"{self.name} not ready at {url} after {READY_TIMEOUT:.0f}s; see {self.log}")
                await asyncio.sleep(0.2)

    async def stop(self) -> int:
        """SIGTERM, wait up to :data:`STOP_TIMEOUT` s, then SIGKILL the session; the exit code."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.process.wait, STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        return await asyncio.to_thread(self.process.wait)


def flashsale_argv(*args: str) -> list[str]:
    """``flashsale ARGS`` with the console script next to this interpreter."""
    return [str(Path(sys.executable).with_name("flashsale")), *args]


PRODUCT_APP = "toolkit.bench.product_app:create_app"
"""The product API with the no-op route."""


def granian_argv(target: str, port: int, workers: int, *, api: bool = False, host: str = "127.0.0.1") -> list[str]:
    """Run ``target`` (``module:factory``) on granian as ``flashsale serve`` does (:func:`main`);
    ``api``: with ``flashsale serve``'s start-up too (a purchase API such as :data:`PRODUCT_APP`)."""
    argv = [sys.executable, "-m", "toolkit.bench.server", target, "--host", host, "--port", str(port)]
    return [*argv, "--workers", str(workers), *(["--api"] if api else [])]


def main(argv: list[str] | None = None) -> None:
    """``python -m toolkit.bench.server MODULE:FACTORY --port N --workers N [--api]``; with
    ``--api`` started as ``flashsale serve`` starts the product (one line per store away, exit
    code 3 when the order-number shards run out)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("target")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--api", action="store_true")
    args = parser.parse_args(argv)
    if not args.api:
        serve_app(args.target, args.host, args.port, args.workers)
        return
    from service.settings import get_settings

    settings = get_settings()
    settings.require_secrets()
    problem = serve_api(settings, args.target, args.host, args.port, args.workers, _warn)
    if problem:
        from service.api.no_shard import EXIT_NO_SHARD  # not earlier: it imports prometheus_client

        print(f"flashsale serve: {problem}", file=sys.stderr)
        sys.exit(EXIT_NO_SHARD)


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
