"""scripts/ensure-services on a machine it sees as fresh, without touching the real servers.

The script runs with a PATH of its own: stub commands that only record their calls (apt-get,
start-stop-daemon, redis-server, ...) plus `sleep`. Its port probes point at ports this test holds
bound but not listening (a probe sees "down") or listening (a probe sees a running server), through
ENSURE_SERVICES_*_PORT; ENSURE_SERVICES_EUID stands in for the root check.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure-services"
BASH = shutil.which("bash") or "/bin/bash"
SERVERS = ("MARIADB", "REDIS", "RABBITMQ")
STUBS = (
    "apt-get",
    "install",
    "start-stop-daemon",
    "mariadb",
    "redis-server",
    "redis-cli",
    "rabbitmq-server",
    "rabbitmq-diagnostics",
)
FRESH_INSTALL = "apt-get install -y -q --no-install-recommends mariadb-server redis-server rabbitmq-server"
MARIADB_START = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql"
REDIS_START = "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379"
RABBITMQ_START = "rabbitmq-server -detached"
RECORD = '#!/bin/sh\nprintf "%s %s DEBIAN_FRONTEND=%s\\n" "${0##*/}" "$*" "${DEBIAN_FRONTEND:-}" >> "$STUB_LOG"\n'
LN = shutil.which("ln") or "/bin/ln"
INSTALLED = "mariadbd mariadb redis-server redis-cli rabbitmq-server rabbitmq-diagnostics"
APT_GET = f"""#!/bin/sh
printf "apt-get %s DEBIAN_FRONTEND=%s\\n" "$*" "${{DEBIAN_FRONTEND:-}}" >> "$STUB_LOG"
if [ "$1" = install ]; then
  for command in {INSTALLED}; do [ -e "${{0%/*}}/$command" ] || {LN} -s _record "${{0%/*}}/$command"; done
  sleep "${{STUB_INSTALL_SECONDS:-0}}"  # a real install takes a while (its package may start the server)
fi
"""


def _bound_port() -> socket.socket:
    """A port nobody else can take that refuses connections until .listen() is called."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture
def ports() -> Iterator[dict[str, socket.socket]]:
    socks = {name: _bound_port() for name in SERVERS}
    yield socks
    for sock in socks.values():
        sock.close()


class Machine:
    """A PATH of stubs, a call log and the environment the script runs in."""

    def __init__(self, tmp_path: Path, ports: dict[str, socket.socket]) -> None:
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.log = tmp_path / "calls.log"
        self.log.touch()
        self.ports = ports
        self.euid = "0"
        self.extra_env: dict[str, str] = {}
        os.symlink(shutil.which("sleep") or "/bin/sleep", self.bin / "sleep")

    def stub(self, *names: str) -> None:
        """Commands that record their calls; `apt-get install` also "installs" the servers' commands."""
        record = self.bin / "_record"
        if not record.exists():
            record.write_text(RECORD)
            record.chmod(0o755)
        for name in names:
            if name == "apt-get":
                (self.bin / name).write_text(APT_GET)
                (self.bin / name).chmod(0o755)
            else:
                (self.bin / name).symlink_to(record)

    def env(self) -> dict[str, str]:
        env = {"PATH": str(self.bin), "STUB_LOG": str(self.log), "ENSURE_SERVICES_EUID": self.euid, **self.extra_env}
        for name, sock in self.ports.items():
            env[f"ENSURE_SERVICES_{name}_PORT"] = str(sock.getsockname()[1])
        return env

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BASH, str(SCRIPT), *args], env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )

    def calls(self) -> list[str]:
        return [line.split(" DEBIAN_FRONTEND=")[0].rstrip() for line in self.log.read_text().splitlines()]


@pytest.fixture
def machine(tmp_path: Path, ports: dict[str, socket.socket]) -> Machine:
    return Machine(tmp_path, ports)


def test_dry_run_on_a_fresh_machine_plans_install_configure_and_start(machine: Machine) -> None:
    machine.stub("apt-get")  # Debian, as root, none of the three servers installed
    result = machine.run("--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("+ apt-get update -q") == 1
    assert f"+ {FRESH_INSTALL}\n" in out
    for start in (MARIADB_START, REDIS_START, RABBITMQ_START):
        assert f"+ {start}" in out
    assert "IDENTIFIED BY ''" in out  # root@127.0.0.1 without a password, on the server it installs
    assert "config set maxmemory-policy noeviction" in out
    for name, sock in machine.ports.items():
        assert f"answers on 127.0.0.1:{sock.getsockname()[1]}" in out, name
    steps = ("apt-get update", "apt-get install", MARIADB_START, REDIS_START, RABBITMQ_START)
    order = [out.index(step) for step in steps]
    assert order == sorted(order)
    assert machine.calls() == []  # a dry run runs nothing


def test_dry_run_starts_installed_servers_without_installing_or_touching_accounts(machine: Machine) -> None:
    machine.stub("apt-get", "mariadbd", "redis-server", "rabbitmq-server")
    result = machine.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert "apt-get" not in result.stdout
    for start in (MARIADB_START, REDIS_START, RABBITMQ_START):
        assert f"+ {start}" in result.stdout
    assert "IDENTIFIED" not in result.stdout  # an existing MariaDB keeps its accounts
    assert machine.calls() == []


def test_installs_only_what_is_missing(machine: Machine) -> None:
    machine.stub("apt-get", "redis-server")
    machine.ports["REDIS"].listen()  # Redis runs
    result = machine.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert "+ apt-get install -y -q --no-install-recommends mariadb-server rabbitmq-server\n" in result.stdout
    assert "Redis answers on" in result.stdout and "left alone" in result.stdout
    assert REDIS_START not in result.stdout and "maxmemory-policy" not in result.stdout


@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)], ids=["run", "dry-run"])
def test_without_root_prints_the_commands_and_exits_2(machine: Machine, dry_run: tuple[str, ...]) -> None:
    machine.stub("apt-get")
    machine.euid = "1000"
    result = machine.run(*dry_run)
    assert result.returncode == 2
    assert "sudo apt-get update && sudo apt-get install -y mariadb-server redis-server rabbitmq-server" in result.stderr
    assert f"sudo {SCRIPT}" in result.stderr
    assert "docker compose up" in result.stderr
    assert len(result.stderr.splitlines()) <= 5
    assert machine.calls() == []


def test_without_apt_points_to_docker_and_exits_2(machine: Machine) -> None:
    result = machine.run()
    assert result.returncode == 2
    assert "apt-get is not available" in result.stderr
    assert "docker compose up" in result.stderr
    assert machine.calls() == []


@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)], ids=["run", "dry-run"])
def test_leaves_running_servers_alone(machine: Machine, dry_run: tuple[str, ...]) -> None:
    machine.stub(*STUBS)  # as root with apt-get: it could install and start, but must not
    for sock in machine.ports.values():
        sock.listen()
    result = machine.run(*dry_run)
    assert result.returncode == 0, result.stderr
    assert "+ " not in result.stdout  # no command planned
    assert machine.calls() == []


def _run_serving(machine: Machine, starts: dict[str, tuple[str, ...]]) -> tuple[int, str, str]:
    """Run the script for real; when a call whose command is in `starts` is recorded, the given
    "servers" start listening (their probe ports begin to accept)."""
    process = subprocess.Popen(
        [BASH, str(SCRIPT)], env=machine.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def serve_once_started() -> None:
        listening: set[str] = set()
        while process.poll() is None:
            for call in machine.calls():
                for server in starts.get(" ".join(call.split()[:2]), starts.get(call.split()[0], ())):
                    if server not in listening:
                        machine.ports[server].listen()
                        listening.add(server)
            time.sleep(0.05)

    watcher = threading.Thread(target=serve_once_started)
    watcher.start()
    out, err = process.communicate(timeout=60)
    watcher.join()
    return process.returncode, out, err


def test_install_path_runs_the_plan_in_order(machine: Machine) -> None:
    """Not a dry run: the stubs record the calls; each "server" starts listening once started."""
    machine.stub("apt-get", "install", "start-stop-daemon")  # a fresh machine: the servers come with apt-get install
    starts = {"start-stop-daemon": ("MARIADB",), "redis-server": ("REDIS",), "rabbitmq-server": ("RABBITMQ",)}
    returncode, out, err = _run_serving(machine, starts)
    assert returncode == 0, out + err
    calls = machine.calls()
    assert calls[:2] == ["apt-get update -q", FRESH_INSTALL]
    assert [call.split()[0] for call in calls[2:]] == [
        "install",
        "start-stop-daemon",
        "mariadb",
        "redis-server",
        "redis-cli",
        "rabbitmq-server",
        "rabbitmq-diagnostics",
    ]
    assert calls[2] == "install -d -o mysql -g mysql /run/mysqld"
    assert calls[3] == MARIADB_START
    assert calls[4].startswith("mariadb --protocol=socket -u root -e CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
    assert calls[5].startswith(REDIS_START)
    redis_port = machine.ports["REDIS"].getsockname()[1]
    assert calls[6] == f"redis-cli -h 127.0.0.1 -p {redis_port} config set maxmemory-policy noeviction"
    assert calls[7] == RABBITMQ_START
    assert "DEBIAN_FRONTEND=noninteractive" in machine.log.read_text().splitlines()[1]
    assert "+ mariadb --protocol=socket" in out  # the commands are echoed as they run


def test_servers_their_packages_started_are_configured_not_started_again(machine: Machine) -> None:
    """On a machine whose init system starts a service on install (systemd), the script only configures."""
    machine.stub("apt-get", "install", "start-stop-daemon")
    machine.extra_env["STUB_INSTALL_SECONDS"] = "0.5"
    returncode, out, err = _run_serving(machine, {"apt-get install": ("MARIADB", "REDIS", "RABBITMQ")})
    assert returncode == 0, out + err
    commands = [call.split()[0] for call in machine.calls()]
    assert commands == ["apt-get", "apt-get", "install", "mariadb", "redis-cli", "rabbitmq-diagnostics"]
    assert out.count("(started by its package)") == 3


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_script_is_shellcheck_clean() -> None:
    result = subprocess.run(
        ["shellcheck", str(SCRIPT), str(ROOT / "scripts" / "ensure-tools")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout
