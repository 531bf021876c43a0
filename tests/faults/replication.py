"""A replicated MariaDB for the failover rows (docs/RELIABILITY.md, "Database failover"): a
primary and one replica from the distribution's binaries on free ports, each with its own data
directory (:class:`tests.servers.PrivateMariaDB`), and one address that moves
(:class:`Forwarder`) in front of them.

- Replication: binary log in ROW format, GTIDs (``MASTER_USE_GTID=slave_pos``,
  ``gtid_strict_mode``), ``sync_binlog=1`` and InnoDB's flush at each commit. Semi-synchronous
  (``semi_sync=True``): MariaDB's built-in semi-sync with ``rpl_semi_sync_master_wait_point =
  AFTER_SYNC``: a commit is answered only once the replica has the transaction in its relay log,
  and the primary's own storage engine commits only after that, so no client ever sees a
  transaction that the replica lacks. Asynchronous otherwise (the replica may miss the last
  commits the clients were told of).
- The address: :class:`Forwarder` stands in for a Kubernetes Service or MaxScale. Every process
  of the sale has ``FLASHSALE_DB__URL`` pointing at it; failover points it at the promoted
  replica and closes the connections it carried, as a proxy does when it changes primary.
- Failover (:meth:`ReplicatedMariaDB.fail_over`): the primary is gone; the replica applies what
  it has received, is promoted (replication reset, ``read_only`` off), and the forwarder follows.
- Switchover (:meth:`ReplicatedMariaDB.switch_over`): the forwarder holds new connections and
  drops the old ones, the replica catches up with the primary's last GTID
  (``MASTER_GTID_WAIT``), is promoted, the old primary becomes its replica, and the forwarder
  lets connections through to the new primary.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import asyncmy  # type: ignore[import-untyped]

from tests.faults.forwarder import Forwarder
from tests.servers import PrivateMariaDB, scratch

SEMI_SYNC_TIMEOUT_MS = 30_000
"""``rpl_semi_sync_master_timeout``: how long a commit waits for the replica's acknowledgement
before the primary falls back to asynchronous replication (docs/OPERATIONS.md, "Database
failover": long, so that a slow replica slows commits instead of silently risking them)."""


class ReplicatingMariaDB(PrivateMariaDB):
    """A :class:`PrivateMariaDB` that can be a primary or a replica (binary log, GTIDs; with
    ``semi_sync`` the replica side of semi-sync on, the primary side set by its role: a replica
    with it on would wait, for each transaction it applies, for an acknowledgement of its own)."""

    def __init__(self, root: Path, server_id: int, *, semi_sync: bool) -> None:
        super().__init__(root)
        self.server_id = server_id
        self.semi_sync = semi_sync

    def _argv(self) -> list[str]:
        semi = (
            [
                "--rpl-semi-sync-slave-enabled=ON",
                "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
                f"--rpl-semi-sync-master-timeout={SEMI_SYNC_TIMEOUT_MS}",
                "--rpl-semi-sync-master-wait-no-slave=ON",  # a replica that went away: commits wait
            ]
            if self.semi_sync
            else []
        )
        return [
            *super()._argv(),
            f"--server-id={self.server_id}",
            f"--log-bin={self.root / 'data' / 'binlog'}",
            f"--relay-log={self.root / 'data' / 'relay'}",
            "--binlog-format=ROW",
            "--log-slave-updates=ON",
            "--gtid-strict-mode=ON",
            "--sync-binlog=1",
            "--innodb-flush-log-at-trx-commit=1",
            "--relay-log-recovery=ON",
            *semi,
        ]


async def sql(port: int, statement: str) -> list[tuple[Any, ...]]:
    """``statement`` as root on 127.0.0.1:``port`` (a connection of its own); its rows."""
    connection = await asyncmy.connect(host="127.0.0.1", port=port, user="root", password="", autocommit=True)
    try:
        async with connection.cursor() as cursor:
            await cursor.execute(statement)
            return list(await cursor.fetchall() or [])
    finally:
        connection.close()


async def replica_status(port: int) -> dict[str, Any]:
    connection = await asyncmy.connect(host="127.0.0.1", port=port, user="root", password="", autocommit=True)
    try:
        async with connection.cursor(asyncmy.cursors.DictCursor) as cursor:
            await cursor.execute("SHOW SLAVE STATUS")
            return dict(await cursor.fetchone() or {})
    finally:
        connection.close()


class ReplicatedMariaDB:
    """Primary, replica and the forwarder in front: see the module docstring."""

    def __init__(self, *, semi_sync: bool) -> None:
        self.semi_sync = semi_sync
        self.primary = ReplicatingMariaDB(scratch("repl-a"), 1, semi_sync=semi_sync)
        self.replica = ReplicatingMariaDB(scratch("repl-b"), 2, semi_sync=semi_sync)
        self.forwarder = Forwarder([("127.0.0.1", self.primary.port)])
        self.events: list[str] = []
        self.behind = 0
        self._last_gtid = 0

    def url(self, database: str = "flashsale") -> str:
        return f"mysql+asyncmy://root@127.0.0.1:{self.forwarder.port}/{database}"

    async def start(self) -> None:
        await asyncio.gather(self.primary.start(), self.replica.start())
        await self._primary_side(self.primary, True)
        await self._follow(self.replica, self.primary)
        await self.forwarder.start()
        if self.semi_sync:
            await _until(self._semi_sync_on, "the primary did not turn semi-synchronous replication on")

    async def _primary_side(self, server: ReplicatingMariaDB, on: bool) -> None:
        if self.semi_sync:
            await sql(server.port, f"SET GLOBAL rpl_semi_sync_master_enabled = {'ON' if on else 'OFF'}")

    async def _semi_sync_on(self) -> bool:
        rows = await sql(self.primary.port, "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'")
        return bool(rows) and rows[0][1] == "ON"

    async def _follow(self, replica: ReplicatingMariaDB, primary: ReplicatingMariaDB) -> None:
        await sql(replica.port, "SET GLOBAL read_only = ON")
        await sql(
            replica.port,
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, MASTER_USER='root',"
            " MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
        )
        await sql(replica.port, "START SLAVE")

        async def running() -> bool:
            status = await replica_status(replica.port)
            return status.get("Slave_IO_Running") == "Yes" and status.get("Slave_SQL_Running") == "Yes"

        await _until(running, "the replica did not start replicating")

    async def _promote(self, replica: ReplicatingMariaDB, *, alone: bool) -> None:
        """``replica`` becomes a primary; semi-synchronous unless ``alone`` (no replica of its own
        yet: every commit would wait for an acknowledgement nobody sends)."""
        await sql(replica.port, "STOP SLAVE")
        await sql(replica.port, "RESET SLAVE ALL")
        await self._primary_side(replica, not alone)
        await sql(replica.port, "SET GLOBAL read_only = OFF")

    async def cut_replication(self) -> None:
        """The replica stops receiving (its I/O thread stopped): a replica that lags behind. An
        asynchronous primary commits on; a semi-synchronous one holds each commit's answer."""
        await sql(self.replica.port, "STOP SLAVE IO_THREAD")

    async def unreplicated(self, count: int, timeout: float = 20.0) -> int:
        """Wait (at most ``timeout`` seconds) until the primary's binary log holds ``count``
        transactions the replica has not received (after :meth:`cut_replication`); how many it holds."""
        replica = _sequence((await sql(self.replica.port, "SELECT @@gtid_slave_pos"))[0][0])
        deadline = time.monotonic() + timeout
        while True:
            ahead = _sequence((await sql(self.primary.port, "SELECT @@gtid_binlog_pos"))[0][0]) - replica
            if ahead >= count or time.monotonic() > deadline:
                return ahead
            await asyncio.sleep(0.1)

    async def kill_primary(self) -> None:
        """SIGKILL the primary, its last GTID read just before (:attr:`behind` after failover)."""
        self._last_gtid = _sequence((await sql(self.primary.port, "SELECT @@gtid_binlog_pos"))[0][0])
        await self.primary.kill()

    async def fail_over(self) -> float:
        """The primary is gone (:meth:`kill_primary`): the replica applies every transaction it
        received, is promoted, and the forwarder points at it. Seconds it took. :attr:`behind`:
        transactions in the dead primary's binary log (read before the kill) the replica never
        had: with asynchronous replication, commits its clients were told of."""
        began = time.monotonic()
        dead, promoted = self.primary, self.replica

        async def applied() -> bool:
            status = await replica_status(promoted.port)
            return (status.get("Master_Log_File"), status.get("Read_Master_Log_Pos")) == (
                status.get("Relay_Master_Log_File"),
                status.get("Exec_Master_Log_Pos"),
            )

        await _until(applied, "the replica did not apply its relay log")
        self.behind = max(self._last_gtid - _sequence((await sql(promoted.port, "SELECT @@gtid_slave_pos"))[0][0]), 0)
        await self._promote(promoted, alone=True)
        self.forwarder.point_at([("127.0.0.1", promoted.port)])
        self.primary, self.replica = promoted, dead
        self.events.append(
            f"failover to :{promoted.port} in {time.monotonic() - began:.1f}s,"
            f" the replica {self.behind} transactions behind the dead primary"
        )
        return time.monotonic() - began

    async def switch_over(self) -> float:
        """A clean switchover (see the module docstring); seconds the forwarder held connections."""
        began = time.monotonic()
        old, new = self.primary, self.replica
        self.forwarder.hold()
        await sql(old.port, "SET GLOBAL read_only = ON")
        await _until(lambda: _no_clients(old.port), "the old primary kept client sessions")
        position = (await sql(old.port, "SELECT @@gtid_binlog_pos"))[0][0]
        caught_up = await sql(new.port, f"SELECT MASTER_GTID_WAIT('{position}', 30)")
        assert caught_up[0][0] == 0, f"the replica did not reach {position}"
        await self._primary_side(old, False)
        await self._promote(new, alone=False)
        await self._follow(old, new)
        self.forwarder.point_at([("127.0.0.1", new.port)])
        self.primary, self.replica = new, old
        if self.semi_sync:
            await _until(self._semi_sync_on, "the new primary did not turn semi-synchronous replication on")
        held = time.monotonic() - began
        self.events.append(f"switchover to :{new.port}, connections held {held:.1f}s")
        return held

    async def remove(self) -> None:
        await self.forwarder.close()
        await asyncio.gather(self.primary.remove(), self.replica.remove(), return_exceptions=True)
        for server in (self.primary, self.replica):
            shutil.rmtree(server.root, ignore_errors=True)


def _sequence(gtid_position: str) -> int:
    """The sequence number of a one-domain GTID position (``0-1-42`` -> 42; empty -> 0)."""
    return int(gtid_position.rsplit("-", 1)[1]) if gtid_position else 0


async def _no_clients(port: int) -> bool:
    rows = await sql(
        port,
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()"
        " AND COMMAND NOT IN ('Binlog Dump', 'Daemon') AND USER NOT IN ('system user', 'event_scheduler')",
    )
    return int(rows[0][0]) == 0


async def _until(condition: Any, problem: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(problem)
