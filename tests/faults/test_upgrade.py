"""A rolling upgrade mid-sale (docs/OPERATIONS.md, "Upgrades and roll-backs"): the previous
release's fleet sells, then is replaced process by process in the documented order while the
buyers buy, with the two releases side by side (an old and a new consumer on the same queue, the
old API publishing to the new consumer), checked as every fault row is, and with no 503 at all.

The previous release is the commit :data:`PREVIOUS_RELEASE`, taken out of this clone with ``git
archive`` into a temporary directory; its processes run the same ``flashsale`` entry point with
that directory first on ``PYTHONPATH`` (its own code, Lua scripts and migrations), on this
virtual environment. That is sound while both releases pin the same dependencies
(``requirements.lock``): when they differ the row is skipped, saying so, until it gets a
virtual environment of its own. Bump :data:`PREVIOUS_RELEASE` at each release.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.harness import FaultSale
from tests.faults.terms import PREFETCH, WATCH_SECONDS, monotonic
from tests.faults.test_faults import _steady_start
from toolkit.sale.isolation import free_port

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PREVIOUS_RELEASE = "852957f"
"""The commit of the release before this one (main when this row was written)."""
SIDE_BY_SIDE_SECONDS = 4.0
"""How long an old and a new process of one kind run together before the old one is stopped."""
_REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The previous release's source tree (skips when this clone lacks the commit, or when the
    releases' dependencies differ)."""
    archive = subprocess.run(["git", "-C", str(_REPO), "archive", PREVIOUS_RELEASE], capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.skip(f"release {PREVIOUS_RELEASE} is not in this clone: {archive.stderr.decode()[:200]}")
    root = tmp_path_factory.mktemp(f"release-{PREVIOUS_RELEASE}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    if (root / "requirements.lock").read_bytes() != (_REPO / "requirements.lock").read_bytes():
        pytest.skip(f"release {PREVIOUS_RELEASE} pins other dependencies: it needs a virtual environment of its own")
    yield root


def _runs_on(pid: int) -> str | None:
    """The ``PYTHONPATH`` process ``pid`` was started with (its code comes from there first)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [item[len(b"PYTHONPATH=") :].decode() for item in environ if item.startswith(b"PYTHONPATH=")]
    return found[0] if found else None


async def _restart(sale: FaultSale, name: str) -> None:
    """Stop ``name`` gracefully (SIGTERM; SIGKILL after 15 s) and wait for the supervisor to
    start it again, with its environment as it is now."""
    entry = sale.supervisor._processes[name]
    assert entry.process is not None, f"{name} is not running"
    entry.expected_exit = True
    os.killpg(entry.process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(entry.process.wait(), 15)
    except TimeoutError:
        os.killpg(entry.process.pid, signal.SIGKILL)
    await sale.supervisor.started_again(name)


async def _replace(sale: FaultSale, name: str, new: str, *argv: str) -> None:
    """Start ``new`` (this release's ``flashsale *argv``) beside the old ``name``, let both run
    :data:`SIDE_BY_SIDE_SECONDS`, then stop the old one for good (SIGTERM: it finishes what it
    holds)."""
    await sale.supervisor.start(new, *argv)
    await asyncio.sleep(SIDE_BY_SIDE_SECONDS)
    entry = sale.supervisor._processes[name]
    await sale.supervisor._stop(entry)


async def test_rolling_upgrade_from_the_previous_release(servers, log_root, record, previous_release):
    old = {"PYTHONPATH": str(previous_release)}
    fault = f"rolling upgrade from {PREVIOUS_RELEASE} mid-sale: consumer, realign, sweep, then the API"
    async with FaultSale(servers, fault, log_root) as sale:
        sale.supervisor._env = {**sale.supervisor._env, **old}  # the previous release's fleet
        await _steady_start(sale)
        sale.supervisor._env = {key: value for key, value in sale.supervisor._env.items() if key != "PYTHONPATH"}
        for entry in sale.supervisor._processes.values():  # their restarts stay on the old release
            entry.env = {**entry.env, **old}
            assert _runs_on(entry.process.pid if entry.process else 0) == str(previous_release), entry.name
        sale.start_load()
        await sale.mid_sale(0.2)
        sale.faulted()
        begun = monotonic()
        await _replace(sale, "consumer", "consumer-new", "consume", "--prefetch", str(PREFETCH))
        port = free_port()  # the old one still holds its own
        metrics = ["--metrics-port", str(port)]
        await _replace(sale, "realign", "realign-new", "realign", "--watch", str(WATCH_SECONDS), "--json", *metrics)
        sale.realign_metrics_port = port
        await _replace(sale, "sweep", "sweep-new", "sweep", "--watch", "5", "--json")
        api = sale.supervisor._processes["api"]
        api.env = {key: value for key, value in api.env.items() if key != "PYTHONPATH"}
        await _restart(sale, "api")  # the one API process: compose starts the new image in its place
        assert await sale.ready()
        sale.fault_over()
        sale.notes.append(f"fleet replaced in {monotonic() - begun:.1f} s")

        async def no_503() -> str | None:
            answered = sum(1 for one in sale.buyers.tries if one.status == 503)
            return f"{answered} purchases answered 503 across the upgrade" if answered else None

        sale.extra_checks.append(no_503)
        record(await sale.finish())
