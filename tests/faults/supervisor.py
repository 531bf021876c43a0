"""The fault suite's processes: the session's private servers (:class:`Servers`) and a case's
``flashsale`` processes under a small supervisor (:class:`Supervisor`) that restarts what ended,
as compose's ``restart: unless-stopped`` would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.terms import monotonic
from tests.servers import PrivateMariaDB, PrivateRabbitMQ, PrivateRedis


@dataclass
class Servers:
    """The session's private servers (one of each, shared by the cases one after another)."""

    redis: PrivateRedis
    mariadb: PrivateMariaDB
    rabbitmq: PrivateRabbitMQ

    async def ensure_running(self) -> None:
        """Start whatever an earlier case left down, resume a paused broker."""
        for server in (self.redis, self.mariadb, self.rabbitmq):
            if server.process is not None:
                server.resume()
            if not server.running:
                await server.start()


@dataclass
class _Process:
    name: str
    argv: list[str]
    process: asyncio.subprocess.Process | None = None
    expected_exit: bool = False  # the suite killed it (or is stopping it)
    stopped: bool = False  # the case is over: not started again
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's, this process only


class Supervisor:
    """The case's ``flashsale`` processes, each in a process group of its own with its output
    in ``<log_dir>/<name>.log``. A process that ends is started again after a second, as
    compose's ``restart: unless-stopped`` would; an end the suite did not cause is recorded in
    :attr:`exits` (a crash, a crash loop, an exit on an outage: not "by itself")."""

    RESTART_DELAY = 1.0

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self._env = env
        self.log_dir = log_dir
        self._processes: dict[str, _Process] = {}
        self.exits: list[str] = []
        self._watcher: asyncio.Task[None] | None = None
        self._respawns: set[asyncio.Task[None]] = set()
        self._script = str(Path(sys.executable).with_name("flashsale"))

    async def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> None:
        """Start ``name`` (``flashsale *argv``), with ``env`` on top of the case's environment."""
        entry = self._processes.setdefault(name, _Process(name, list(argv), env=dict(env or {})))
        await self._spawn(entry)
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())

    async def _spawn(self, entry: _Process) -> None:
        log = (self.log_dir / f"{entry.name}.log").open("ab")
        with log:
            entry.process = await asyncio.create_subprocess_exec(
                self._script,
                *entry.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self._env, **entry.env},
                start_new_session=True,
            )
        entry.expected_exit = False
        entry.starts += 1

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            for entry in list(self._processes.values()):
                process = entry.process
                if process is None or process.returncode is None:
                    continue
                if not entry.expected_exit:
                    self.exits.append(f"{entry.name} exited {process.returncode}")
                entry.process = None
                self._respawns.add(asyncio.create_task(self._respawn(entry)))

    async def _respawn(self, entry: _Process) -> None:
        await asyncio.sleep(self.RESTART_DELAY)
        if entry.process is None and not entry.stopped:
            await self._spawn(entry)

    def pid(self, name: str) -> int | None:
        entry = self._processes.get(name)
        return None if entry is None or entry.process is None else entry.process.pid

    def running(self, name: str) -> bool:
        entry = self._processes.get(name)
        return entry is not None and entry.process is not None and entry.process.returncode is None

    def children(self, name: str) -> list[int]:
        """The child processes of ``name`` (granian's workers of ``api``)."""
        pid = self.pid(name)
        if pid is None:
            return []
        found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
        return sorted(int(p) for p in found.stdout.split())

    async def kill(self, name: str) -> None:
        """SIGKILL ``name``'s whole process group (the supervisor starts it again)."""
        entry = self._processes[name]
        if entry.process is None:
            return
        entry.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(entry.process.pid, signal.SIGKILL)
        await entry.process.wait()

    async def started_again(self, name: str, timeout: float = 30.0) -> None:
        deadline = monotonic() + timeout
        while not self.running(name):
            if monotonic() > deadline:
                raise AssertionError(f"{name} was not started again")
            await asyncio.sleep(0.05)

    async def stop_all(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for entry in self._processes.values():
            entry.stopped = True
        await asyncio.gather(*self._respawns, return_exceptions=True)
        await asyncio.gather(*(self._stop(entry) for entry in self._processes.values()))

    async def _stop(self, entry: _Process) -> None:
        entry.stopped = True
        process = entry.process
        if process is None:
            return
        entry.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            pass  # granian's graceful stop can hang after a respawn
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()

    def starts(self) -> dict[str, int]:
        """How often each process was started (the first start counts)."""
        return {name: entry.starts for name, entry in self._processes.items()}

    def log_text(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        return ""
