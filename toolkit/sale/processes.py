"""The subprocesses of ``flashsale sale`` (the API, ``flashsale consume``, the channel simulator)
and the API's readiness."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from toolkit.sale.errors import SetupError, stderr

STOP_TIMEOUT = 30.0  # seconds a process gets after SIGTERM before SIGKILL
READY_POLL = 0.25  # seconds between readiness polls


class Processes:
    """The sale's subprocesses, each in a process group of its own, output in
    ``<log_dir>/<name>.log``, environment ``env``. :meth:`stop` fills ``exit_codes``."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self._env = env
        self.log_dir = log_dir
        self._running: dict[str, asyncio.subprocess.Process] = {}
        self.exit_codes: dict[str, int] = {}

    async def start(self, name: str, *args: str) -> None:
        """Start ``flashsale ARGS`` (the console script next to this interpreter).

        Raises:
            SetupError: the console script is not installed.
        """
        script = Path(sys.executable).with_name("flashsale")
        if not script.exists():
            raise SetupError(f"console script {script} not found (install the project into this environment)")
        await self.start_argv(name, [str(script), *args])

    async def start_argv(self, name: str, argv: list[str]) -> None:
        """Start the program ``argv`` (e.g. ``python -m MODULE ...`` with this interpreter)."""
        log = await asyncio.to_thread((self.log_dir / f"{name}.log").open, "wb")
        with log:
            self._running[name] = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,
            )

    def returncode(self, name: str) -> int | None:
        """``name``'s exit status, None while it runs."""
        return self._running[name].returncode

    async def finish(self, names: list[str], grace: float) -> dict[str, int]:
        """Give ``names`` ``grace`` seconds to exit by themselves, stop those still running as
        :meth:`stop` does, and forget them; their exit statuses."""
        running = [(name, self._running.pop(name)) for name in names]
        await asyncio.gather(*(self._stop(name, process, grace) for name, process in running))
        return {name: self.exit_codes[name] for name in names}

    def cpu_seconds(self, *prefixes: str) -> float:
        """CPU seconds (user + system) used so far by the running processes whose names start
        with one of ``prefixes``, their children included (a child that already exited is not)."""
        total = 0.0
        for name, process in self._running.items():
            if not name.startswith(prefixes) or process.returncode is not None:
                continue
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(process.pid)
                for each in [parent, *parent.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        times = each.cpu_times()
                        total += times.user + times.system
        return total

    def exited(self) -> list[str]:
        """``name (exit N)`` of every process that has already exited."""
        return [f"{name} (exit {p.returncode})" for name, p in self._running.items() if p.returncode is not None]

    async def stop(self) -> None:
        """SIGTERM every process, wait up to :data:`STOP_TIMEOUT` seconds, then SIGKILL its group."""
        await asyncio.gather(*(self._stop(name, process) for name, process in self._running.items()))

    async def _stop(self, name: str, process: asyncio.subprocess.Process, grace: float = 0.0) -> None:
        """Give ``process`` ``grace`` seconds to end by itself, then SIGTERM, then after
        :data:`STOP_TIMEOUT` seconds SIGKILL its group."""
        if grace:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), grace)
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
            except TimeoutError:
                stderr.print(f"[yellow]warning:[/] {name} ignored SIGTERM for {STOP_TIMEOUT:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the process and anything it left behind
        self.exit_codes[name] = await process.wait()


async def wait_ready(client: httpx.AsyncClient, processes: Processes, timeout: float) -> None:
    """Poll ``GET /api/v1/health/ready`` until 200.

    Raises:
        SetupError: not ready within ``timeout`` seconds, or a subprocess exited meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        if dead := processes.exited():
            raise SetupError(f"{', '.join(dead)} exited during start-up")
        try:
            response = await client.get("/api/v1/health/ready")
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        if time.monotonic() > deadline:
            raise SetupError(f"API at {client.base_url} not ready after {timeout:.0f}s: {last}")
        await asyncio.sleep(READY_POLL)
