"""A short command starts without loading what it does not use: ``flashsale --help`` none of
the web framework, the stores' drivers or pydantic, ``flashsale token`` only the settings and
PyJWT. Checked on the set of modules the command imported (never on the clock: a busy machine
would make a timing test flaky; docs/CLI.md gives the numbers and how they were measured)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HEAVY = ("litestar", "sqlalchemy", "asyncmy", "aio_pika", "aiormq", "redis", "granian", "httpx", "rich", "alembic")
"""Top-level packages no short command needs (each costs tens of milliseconds or more)."""

_IMPORTED = """
import sys
from service.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    assert not exit.code, exit.code
sys.stdout = sys.__stderr__  # the command printed to stdout; the module list goes to stderr
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
"""


def _imported(*argv: str) -> set[str]:
    env = {**os.environ, "FLASHSALE_ENV": "development"}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED, *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return {line.split(".", 1)[0] for line in done.stderr.splitlines()}


@pytest.mark.parametrize(
    ("argv", "forbidden"),
    [
        (["--help"], (*HEAVY, "pydantic", "pydantic_settings", "jwt", "structlog", "msgspec")),
        (["token", "--user", "u"], HEAVY),
    ],
    ids=["--help", "token"],
)
def test_a_short_command_loads_nothing_heavy(argv: list[str], forbidden: tuple[str, ...]) -> None:
    imported = _imported(*argv)
    assert imported.isdisjoint(forbidden), sorted(imported.intersection(forbidden))
