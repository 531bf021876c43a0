"""The fault suite's session: its private servers, the table of results, and the rule that it
runs only when asked for (``make faults``: ``pytest -m faults``; CI's subset: ``-m faults_ci``).

The servers are private (tests/servers.py): a Redis with AOF, a MariaDB and a second RabbitMQ
node on free ports, under a temporary directory, removed at the end. The system's servers are
never used: nothing here reads ``tests/integration/conftest.py``.

The table is printed at the end of the run and, when ``FLASHSALE_FAULTS_OUT`` names a file,
written there as Markdown (the table, then each row's details as JSON) with the machine it ran
on, for docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.faults.report import HEADERS, Row, format_row
from tests.faults.supervisor import Servers
from tests.servers import PrivateMariaDB, PrivateRabbitMQ, PrivateRedis, scratch

ROWS: list[Row] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fault cases run only when the mark expression names them (``-m faults``, ``-m
    faults_ci``): ``make test`` and ``make test-fast`` skip them."""
    expression = config.getoption("markexpr") or ""
    if "faults" in expression and "not faults" not in expression:
        return
    skip = pytest.mark.skip(reason="fault suite: make faults (pytest -m faults), CI subset -m faults_ci")
    for item in items:
        if item.get_closest_marker("faults") is not None:  # the mark, not a folder named faults
            item.add_marker(skip)


@pytest.fixture(scope="session")
async def servers() -> AsyncIterator[Servers]:
    started = Servers(
        PrivateRedis(scratch("faults-redis")),
        PrivateMariaDB(scratch("faults-mariadb")),
        PrivateRabbitMQ(scratch("faults-rabbitmq")),
    )
    try:
        await asyncio.gather(started.redis.start(), started.mariadb.start(), started.rabbitmq.start())
        yield started
    finally:
        await asyncio.gather(
            started.redis.remove(), started.mariadb.remove(), started.rabbitmq.remove(), return_exceptions=True
        )


@pytest.fixture(scope="session")
def log_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture
def record():
    """``record(row)``: the row goes into the table; then the case's verdict is asserted."""

    def add(row: Row) -> None:
        ROWS.append(row)
        problems = {
            name: getattr(row, name)
            for name in ("lost", "duplicate", "no_202", "oversold", "over_limit", "stranded")
            if getattr(row, name)
        }
        logs = row.details.get("logs")
        assert row.ok, f"{row.fault}: {problems or ''} recovered={row.recovered} {row.failed_checks} logs: {logs}"

    return add


def machine() -> str:
    """One line about the machine: CPU model and count, memory, OS, Python, server versions."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass

    def version(*argv: str) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
        except OSError:
            return "?"
        return out.strip().splitlines()[0] if out.strip() else "?"

    servers = "; ".join(
        (
            version("redis-server", "--version").split(" sha=")[0],
            version("mariadbd", "--version"),
            "RabbitMQ " + (version("dpkg-query", "-W", "-f=${Version}", "rabbitmq-server") or "?"),
        )
    )
    return (
        f"{cpu} x {os.cpu_count()}{memory}; {platform.system()} {platform.release()};"
        f" Python {platform.python_version()}; {servers}"
    )


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = [cell.replace("|", "\\|") for cell in format_row(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if not ROWS:
        return
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    rendered = table(ROWS)
    terminalreporter.write_sep("=", "fault suite")
    terminalreporter.write_line(rendered)
    passed = sum(row.ok for row in ROWS)
    terminalreporter.write_line(f"{passed} of {len(ROWS)} rows hold every invariant and recovered by themselves")
    target = os.environ.get("FLASHSALE_FAULTS_OUT")
    if not target:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    document = [
        f"Run {when}, commit {commit.stdout.strip() or '?'}; machine: {machine()}.",
        "",
        rendered,
        "",
        f"{passed} of {len(ROWS)} rows hold every invariant and recovered by themselves.",
        "",
        "Details per row (JSON):",
        "",
        "```json",
        json.dumps({row.fault: {"ok": row.ok, **row.details} for row in ROWS}, indent=2, default=str),
        "```",
        "",
    ]
    Path(target).write_text("\n".join(document))
    terminalreporter.write_line(f"written to {target}")
