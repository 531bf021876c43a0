"""Private Redis, MariaDB and RabbitMQ servers: started by a test (or the fault suite) on free
ports under a directory of its own, killed, paused and restarted at will, and removed
afterwards. Nothing here touches the system's servers: each private server has its own data
directory, ports, socket and (RabbitMQ) node name, Erlang port mapper and cookie.

- :class:`PrivateRedis`: ``redis-server`` with AOF (``appendfsync everysec``), ``noeviction``.
- :class:`PrivateMariaDB`: ``mariadb-install-db --auth-root-authentication-method=normal``,
  then ``mariadbd`` on 127.0.0.1 (root without a password).
- :class:`PrivateRabbitMQ`: a second RabbitMQ node beside the system one, with its own
  ``RABBITMQ_NODENAME``, ``RABBITMQ_NODE_PORT``, ``RABBITMQ_DIST_PORT``, ``ERL_EPMD_PORT`` (an
  ``epmd`` of its own), ``RABBITMQ_MNESIA_BASE``, ``RABBITMQ_LOG_BASE``,
  ``RABBITMQ_CONFIG_FILE`` and ``RABBITMQ_ENABLED_PLUGINS_FILE`` (no plugins).

Every process is started in a session of its own and stopped by its own process group id; a
server killed with SIGKILL keeps its data directory, so :meth:`PrivateServer.start` brings it
back with what it had written (Redis: the AOF, up to a second of writes lost; MariaDB: InnoDB
crash recovery; RabbitMQ: its quorum queues).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from toolkit.sale.isolation import free_port

START_TIMEOUT = 90.0  # seconds a server gets to answer after start (RabbitMQ boots in ~5 s, MariaDB recovers)
STOP_TIMEOUT = 30.0


class ServerMissing(RuntimeError):
    """A server program is not installed (the message names it and the package)."""


def _program(name: str, package: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None
    )
    if found is None:
        raise ServerMissing(f"{name} is not installed (Debian/Ubuntu package {package})")
    return found


def _answers(port: int, greeting: bool = False) -> bool:
    """Something accepts TCP connections on 127.0.0.1:``port`` (and, with ``greeting``, sends
    bytes first, as MySQL's handshake does)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            if greeting:
                sock.settimeout(2)
                return bool(sock.recv(16))
            return True
    except OSError:
        return False


class PrivateServer:
    """One server process under ``root`` (its data survives a kill); ``name`` for messages."""

    name = "server"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- to implement -------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    async def _ready(self) -> bool:
        raise NotImplementedError

    # -- life ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.name}.out"

    async def start(self, timeout: float = START_TIMEOUT) -> float:
        """Start the server (again) and wait until it answers; seconds it took.

        Raises:
            RuntimeError: it exited, or did not answer within ``timeout`` seconds (log tail included).
        """
        assert not self.running, f"{self.name} is running already"
        began = time.monotonic()
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self._argv(),
                env=self._env(),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        while not await self._ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.tail()}")
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"{self.name} did not answer within {timeout:.0f}s: {self.tail()}")
            await asyncio.sleep(0.1)
        return time.monotonic() - began

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    async def kill(self) -> None:
        """SIGKILL the server (its whole process group) and reap it: a crash, data kept."""
        if self.process is None:
            return
        self._signal_group(signal.SIGCONT)  # a paused server dies as well
        self._signal_group(signal.SIGKILL)
        await asyncio.to_thread(self.process.wait)

    async def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after :data:`STOP_TIMEOUT` seconds."""
        if self.process is None or self.process.poll() is not None:
            return
        self._signal_group(signal.SIGCONT)
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.process.wait, STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            await self.kill()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open, nothing is answered (a frozen server)."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)

    async def remove(self) -> None:
        """Stop the server and delete its directory."""
        await self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis(PrivateServer):
    """``redis-server`` on ``port`` with its data in ``root`` (AOF, fsync every second, no RDB
    snapshots, ``maxmemory-policy noeviction``)."""

    name = "redis"

    def __init__(self, root: Path, port: int | None = None, *, aof: bool = True) -> None:
        super().__init__(root)
        self.port = port or free_port()
        self._aof = aof
        self._binary = _program("redis-server", "redis-server")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        aof = ["--appendonly", "yes", "--appendfsync", "everysec"] if self._aof else ["--appendonly", "no"]
        return [
            self._binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.root),
            "--save",
            "",
            *aof,
            "--maxmemory-policy",
            "noeviction",
            "--daemonize",
            "no",
        ]

    async def _ready(self) -> bool:
        return await asyncio.to_thread(self._pong)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.settimeout(2)
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")  # -LOADING while the AOF is read
        except OSError:
            return False

    async def command(self, *args: str) -> object:
        """One command on a connection of its own (FLUSHALL, CONFIG GET ...)."""
        from redis.asyncio import Redis

        client = Redis.from_url(self.url, decode_responses=True)
        try:
            return await client.execute_command(*args)
        finally:
            await client.aclose()


class PrivateMariaDB(PrivateServer):
    """``mariadbd`` on 127.0.0.1:``port``, data in ``root/data`` (created by
    ``mariadb-install-db`` on first start), root without a password, no option files read."""

    name = "mariadb"

    def __init__(self, root: Path, port: int | None = None) -> None:
        super().__init__(root)
        self.port = port or free_port()
        self._server = _program("mariadbd", "mariadb-server")
        self._install = _program("mariadb-install-db", "mariadb-server")
        self._as_root = ["--user=root"] if os.geteuid() == 0 else []

    def url(self, database: str = "flashsale") -> str:
        return f"mysql+asyncmy://root@127.0.0.1:{self.port}/{database}"

    async def start(self, timeout: float = START_TIMEOUT) -> float:
        data = self.root / "data"
        if not data.exists():
            install = await asyncio.create_subprocess_exec(
                self._install,
                "--no-defaults",
                f"--datadir={data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *self._as_root,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TMPDIR": str(self.root)},  # not /tmp: its temporary tables are its own
            )
            output, _ = await install.communicate()
            if install.returncode != 0:
                shutil.rmtree(data, ignore_errors=True)
                raise RuntimeError(f"mariadb-install-db failed: {output.decode(errors='replace')[-2000:]}")
        return await super().start(timeout)

    def _argv(self) -> list[str]:
        return [
            self._server,
            "--no-defaults",
            f"--datadir={self.root / 'data'}",
            f"--port={self.port}",
            f"--socket={self.root / 'sock'}",
            "--skip-networking=0",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.root / 'mariadb.pid'}",
            f"--tmpdir={self.root}",
            f"--log-error={self.root / 'error.log'}",
            "--innodb-buffer-pool-size=128M",
            "--max-connections=1000",
            "--skip-name-resolve",
            *self._as_root,
        ]

    async def _ready(self) -> bool:
        return await asyncio.to_thread(_answers, self.port, True)

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.root / "error.log").read_text(errors="replace").splitlines()[-lines:])
        return super().tail(lines)


class PrivateRabbitMQ(PrivateServer):
    """A RabbitMQ node of its own beside the system's: node ``flashsale-<hex>@localhost``, AMQP
    on 127.0.0.1:``port``, its own distribution port, ``epmd`` (started and stopped here, by its
    pid), Erlang cookie (``HOME`` under ``root``), database, logs, configuration and an empty
    plugin list. ``rabbitmqctl -n NODE await_startup`` says when it is up."""

    name = "rabbitmq"

    def __init__(self, root: Path, port: int | None = None) -> None:
        super().__init__(root)
        self.port = port or free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"flashsale-{secrets.token_hex(3)}@localhost"
        server = Path(_program("rabbitmq-server", "rabbitmq-server"))
        # /usr/sbin/rabbitmq-server re-runs itself as the rabbitmq user (su) with the system
        # node's home; the scripts it wraps take our environment as it is.
        scripts = Path("/usr/lib/rabbitmq/bin")
        self._server = str(scripts / "rabbitmq-server") if (scripts / "rabbitmq-server").exists() else str(server)
        self._ctl = str(scripts / "rabbitmqctl") if (scripts / "rabbitmqctl").exists() else _program("rabbitmqctl", "")
        self._epmd_binary = _program("epmd", "erlang-base")
        self._epmd: subprocess.Popen[bytes] | None = None
        for directory in ("home", "mnesia", "log"):
            (root / directory).mkdir(parents=True, exist_ok=True)
        (root / "enabled_plugins").write_text("[].\n")
        (root / "rabbitmq.conf").write_text("loopback_users.guest = true\nlog.file.level = warning\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _env(self) -> dict[str, str]:
        root = self.root
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        return {
            **keep,
            "HOME": str(root / "home"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),  # not the system's
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(root / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def _argv(self) -> list[str]:
        return [self._server]

    async def start(self, timeout: float = START_TIMEOUT) -> float:
        if self._epmd is None or self._epmd.poll() is not None:
            with (self.root / "epmd.out").open("ab") as out:
                self._epmd = subprocess.Popen(
                    [self._epmd_binary, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            while not await asyncio.to_thread(_answers, self.epmd_port):
                await asyncio.sleep(0.05)
        return await super().start(timeout)

    async def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n NODE ARGS`` with the node's environment."""
        return await asyncio.to_thread(
            subprocess.run,
            [self._ctl, "-n", self.node, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    async def _ready(self) -> bool:
        if not await asyncio.to_thread(_answers, self.port):
            return False
        return (await self.ctl("await_startup", "--timeout", "30")).returncode == 0

    def tail(self, lines: int = 15) -> str:
        logs = sorted((self.root / "log").glob("*.log"))
        with contextlib.suppress(OSError, IndexError):
            return "\n".join(logs[0].read_text(errors="replace").splitlines()[-lines:])
        return super().tail(lines)

    async def remove(self) -> None:
        await super().remove()
        if self._epmd is not None and self._epmd.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._epmd.pid, signal.SIGKILL)
            await asyncio.to_thread(self._epmd.wait)


@contextlib.asynccontextmanager
async def private_server(server: PrivateServer, *, start: bool = True) -> AsyncIterator[PrivateServer]:
    """``server`` (started unless ``start`` is False: the test starts it later), removed on exit."""
    try:
        if start:
            await server.start()
        yield server
    finally:
        await server.remove()


def scratch(prefix: str) -> Path:
    """A new temporary directory for a private server."""
    return Path(tempfile.mkdtemp(prefix=f"flashsale-{prefix}-"))
