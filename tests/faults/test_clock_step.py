"""Fault row: one API deployment's wall clock steps back two seconds mid-sale (docs/RELIABILITY.md).

An NTP step (or a virtual machine resumed with a stale clock) moves CLOCK_REALTIME only; the
monotonic clock never goes back. The row does that for real to the ``flashsale serve`` process
and its workers, and to nothing else: they run under libfaketime (Debian package ``faketime``)
with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` and a timestamp file the suite rewrites from ``+0`` to
``-2`` mid-sale (read again every second, ``FAKETIME_CACHE_DURATION``). The consumer, the
realignment and the sweep keep the machine's clock, as do Redis (the sale window is checked in
``lua/reserve.lua`` against Redis server time) and MariaDB.

Besides the suite's columns (two requests with one order number count as duplicates): every
202's order number is well formed (format and check digits); the numbers minted after the step
carry a time two seconds behind the machine's (the fault took effect). Sale windows are checked
in ``lua/reserve.lua`` against Redis server time, which this fault does not move.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from service.domain.order_numbers.format import is_valid_order_no
from tests.faults.harness import FaultSale
from tests.faults.terms import monotonic
from toolkit.sale.plan import ACCEPTED

pytestmark = [pytest.mark.faults, pytest.mark.slow]

_LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
STEP_SECONDS = 2


def _clock_env(offset_file: Path) -> dict[str, str]:
    return {
        "LD_PRELOAD": str(_LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_CACHE_DURATION": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def _minted_at(order_no: str) -> datetime:
    """The UTC second an order number carries (after its 2-letter prefix: yyyyMMddHHmmss)."""
    return datetime.strptime(order_no[2:16], "%Y%m%d%H%M%S").replace(tzinfo=UTC)


@pytest.mark.skipif(not _LIBFAKETIME.exists(), reason=f"{_LIBFAKETIME} missing (Debian package faketime)")
async def test_api_clock_steps_back_two_seconds(servers, log_root, record):
    async with FaultSale(servers, f"API's wall clock steps back {STEP_SECONDS} s mid-sale", log_root) as sale:
        offset = sale.log_dir / "api-clock-offset"
        offset.write_text("+0\n")
        await sale.start_all(api_env=_clock_env(offset))
        assert await sale.ready()
        sale.start_load()
        await sale.mid_sale(0.3)
        sale.faulted()
        stepped_at = monotonic()
        wall_then = datetime.now(UTC)

        def wall_at(at: float) -> datetime:
            return wall_then + timedelta(seconds=at - stepped_at)

        offset.write_text(f"-{STEP_SECONDS}\n")
        await asyncio.sleep(3)  # the workers read the file again within a second
        sale.fault_over()

        async def numbers_valid_and_stepped() -> str | None:
            told = [o.order_no for o in sale.buyers.outcomes if o is not None and o.code == ACCEPTED and o.order_no]
            canary = [(entry["accepted"], entry["order_no"]) for entry in sale.canary]
            invalid = [n for n in told + [order_no for _, order_no in canary] if not is_valid_order_no(n)]
            if invalid:
                return f"{len(invalid)} order numbers not well formed, e.g. {invalid[0]}"
            # The machine's time each canary order was accepted at, against the time in its number.
            lag = [(wall_at(at) - _minted_at(order_no)).total_seconds() for at, order_no in canary if at > stepped_at]
            behind = [seconds for seconds in lag if seconds > STEP_SECONDS - 0.5]
            if not behind:
                return "the step did not show: no canary order number minted after it carries an earlier time"
            sale.notes.append(f"{len(behind)} canary numbers minted after the step carry a time {STEP_SECONDS} s back")
            return None

        sale.extra_checks.append(numbers_valid_and_stepped)
        record(await sale.finish())
