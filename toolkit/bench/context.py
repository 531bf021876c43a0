"""What every phase of ``flashsale bench`` shares: options, the run's context, product ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from service.settings import Settings
from toolkit.bench.profile import ProfileSummary

WARMUP_SECONDS = 1.0
PRICE = 100  # minor currency units
SOLD_OUT, ACCEPT = 1, 2  # product ids of the HTTP rows (stock mode redis)
DB_SOLD_OUT, DB_ACCEPT = 3, 4  # the same two products in stock mode database
DRAIN, RAW_ONE, RAW_BATCH, RESERVE = 100, 200, 300, 400  # product ids of the drain rows: + round number
PIPELINE = 500  # product ids of the pipeline rows: + 10 x round + 2 x row (+ 1: its warm-up)
ACCEPT_STOCK = 100_000_000  # units: the accept row never runs out
ACCEPT_LIMIT = 1_000_000  # per-user limit of the accept product: never bites
RAW_CONNECTIONS = 8


def pipeline_product(round_no: int, row_index: int, *, warmup: bool = False) -> int:
    """The product of a pipeline row's measured load (or of its warm-up) in round ``round_no``."""
    return PIPELINE + 10 * round_no + 2 * row_index + int(warmup)


@dataclass(frozen=True, slots=True)
class Options:
    """``duration`` seconds of measured load per HTTP row and round, wrk ``connections`` and
    ``threads``, granian ``workers``, ``backlog`` orders for the drain rows, ``consumers``
    processes draining it together, ``batch`` orders per batched transaction, ``rounds`` (every
    row measured that many times, interleaved),
    ``profile_dir`` for py-spy output (None: no profiling), ``only``: the row keys to measure
    (empty: every row; the drain rows run together when any of them is named)."""

    duration: int = 8
    connections: int = 64
    threads: int = 1
    workers: int = 1
    backlog: int = 20_000
    consumers: int = 2
    batch: int = 100
    rounds: int = 1
    profile_dir: Path | None = None
    only: tuple[str, ...] = ()

    def wants(self, key: str) -> bool:
        """True when row ``key`` is measured in this run."""
        return not self.only or key in self.only


class BenchError(RuntimeError):
    """The run could not be set up or a row could not be measured (exit status 2)."""


@dataclass
class Context:
    """The run: its settings, options, subprocess environment and log directory, the store
    processes to watch, where to print progress and the profile summaries collected."""

    settings: Settings
    options: Options
    env: dict[str, str]
    log_dir: Path
    stores: dict[str, list[int]]
    console: Console
    profiles: dict[str, ProfileSummary]
