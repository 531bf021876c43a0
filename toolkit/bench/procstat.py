"""CPU accounting from ``/proc`` (Linux): process trees, the whole machine, the service daemons.

Times are seconds of CPU (user + system); shares are CPU seconds per wall second, i.e. cores
(1.0 = one core busy the whole time).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

CLK_TCK = os.sysconf("SC_CLK_TCK")
STORE_COMMANDS = {"mariadbd": "mysql", "mysqld": "mysql", "redis-server": "redis", "beam.smp": "rabbitmq"}


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards), or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2 :].split()


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def process_tree(root: int) -> list[int]:
    """``root`` and all its live descendants (e.g. a granian server and its workers)."""
    parents: dict[int, list[int]] = {}
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds consumed so far by each of the live processes ``pids``."""
    seconds = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            seconds[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15)
    return seconds


def store_pids() -> dict[str, list[int]]:
    """Processes of the local MySQL/MariaDB, Redis and RabbitMQ servers, by store name
    (read-only; empty when they run elsewhere)."""
    found: dict[str, list[int]] = {}
    for pid in _all_pids():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm in STORE_COMMANDS:
            found.setdefault(STORE_COMMANDS[comm], []).append(pid)
    return found


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from ``/proc/stat``."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


class MachineInfo(TypedDict):
    """The machine a run measured on (:func:`machine_info`); ``versions`` of the framework, the
    server, wrk and the stores are added by the run."""

    nproc: int  # CPUs this process may run on
    cpus_online: int
    cpu_model: str
    memory_gib: float
    kernel: str
    python: str
    load_average: list[float]
    versions: NotRequired[dict[str, str]]


@dataclass(frozen=True, slots=True)
class CpuSample:
    """One reading of the machine's and the watched processes' CPU counters."""

    machine: tuple[int, int]
    groups: dict[str, dict[int, float]]

    @classmethod
    def take(cls, groups: dict[str, list[int]]) -> CpuSample:
        """Read now; ``groups`` maps a label to the pids to add up under it."""
        return cls(machine_jiffies(), {name: cpu_seconds(pids) for name, pids in groups.items()})

    def shares(self, later: CpuSample, wall: float) -> dict[str, float]:
        """Cores used per group between this sample and ``later`` (``wall`` seconds apart), plus
        ``machine``: the share of all CPUs busy (0-1) in that window. A process counts only when
        it lived at both readings (one that exited between them, e.g. another user's server
        matched by name, would take its whole CPU time away from the group)."""
        shares = {}
        for name, before in self.groups.items():
            after = later.groups[name]
            used = sum(after[pid] - seconds for pid, seconds in before.items() if pid in after)
            shares[name] = round(used / wall, 3)
        busy = later.machine[0] - self.machine[0]
        total = later.machine[1] - self.machine[1]
        shares["machine"] = round(busy / total, 3) if total else 0.0
        return shares


def machine_info() -> MachineInfo:
    """nproc, CPU model, memory (GiB), kernel, load average: printed with every run."""
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    return MachineInfo(
        nproc=len(os.sched_getaffinity(0)),
        cpus_online=os.cpu_count() or 1,
        cpu_model=model,
        memory_gib=round(mem_kib / 2**20, 1),
        kernel=platform.release(),
        python=platform.python_version(),
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
