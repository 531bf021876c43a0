"""A ``FLASHSALE_*`` variable the settings do not know ends the command with one line naming it
and the closest known name, exit code 2, from the environment or ``.env``
(service/environment_errors.py); ``FLASHSALE_ALLOW_UNKNOWN`` lets named ones (or any) through."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.api.no_shard import SERVE_PID_ENV
from service.environment_errors import OTHER_VARIABLES
from service.settings import VARIABLES

FLASHSALE = [sys.executable, "-c", "from service.cli.main import main; main()"]
ROOT = Path(__file__).resolve().parents[2]


def _token(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``flashsale token --user 7`` in ``tmp_path`` (its ``.env``, if any), with ``env`` added:
    a command that reads the settings and no store."""
    clean = {name: value for name, value in os.environ.items() if not name.upper().startswith("FLASHSALE_")}
    return subprocess.run(
        [*FLASHSALE, "token", "--user", "7"],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(ROOT), "FLASHSALE_ENV": "development", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_misspelt_variable_ends_the_command_naming_the_closest(tmp_path: Path) -> None:
    done = _token(tmp_path, FLASHSALE_REDIS_URL="redis://elsewhere:6379/0")
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "flashsale: configuration error: FLASHSALE_REDIS_URL: no such setting (did you mean FLASHSALE_REDIS__URL?)"
    ]


def test_a_misspelt_variable_in_dotenv_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("FLASHSALE_AMQP__URLS=amqp://guest:guest@elsewhere:5672/\n")
    done = _token(tmp_path)
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [
        "flashsale: configuration error: FLASHSALE_AMQP__URLS: no such setting (did you mean FLASHSALE_AMQP__URL?)"
    ]


def test_allowed_names_pass_and_the_known_ones_still_work(tmp_path: Path) -> None:
    allowed = _token(tmp_path, FLASHSALE_ALLOW_UNKNOWN='["FLASHSALE_SIDECAR_MODE"]', FLASHSALE_SIDECAR_MODE="on")
    assert allowed.returncode == 0, allowed
    assert allowed.stdout.count(".") == 2  # a JWT
    anything = _token(tmp_path, FLASHSALE_ALLOW_UNKNOWN='["*"]', FLASHSALE_REDIS_URL="x")
    assert anything.returncode == 0, anything
    named_other = _token(tmp_path, FLASHSALE_ALLOW_UNKNOWN='["FLASHSALE_SIDECAR_MODE"]', FLASHSALE_REDIS_URL="x")
    assert named_other.returncode == 2, named_other


@pytest.mark.parametrize(
    ("given", "unknown"),
    [
        (["FLASHSALE_REDIS__URL", "FLASHSALE_LOG_LEVEL", "FLASHSALE_ENV", "PATH", "FLASHSALEX"], []),
        (["flashsale_redis__url", "FLASHSALE_REDIS"], []),  # any case; a group as one JSON object
        (["FLASHSALE_PAYMENT__CHANNEL_SECRETS__MOCKPAY"], []),  # a key of a dict setting
        ([SERVE_PID_ENV, "FLASHSALE_FAULTS_OUT", "FLASHSALE_TEST_ARTIFACTS"], []),
        (
            ["flashsale_db_url", "FLASHSALE_REDIS__URL__X", "FLASHSALE_LOGLEVEL"],
            ["FLASHSALE_LOGLEVEL", "FLASHSALE_REDIS__URL__X", "flashsale_db_url"],
        ),
    ],
)
def test_which_names_are_unknown(given: list[str], unknown: list[str]) -> None:
    assert VARIABLES.unknown(given) == unknown


def test_the_line_names_each_and_its_closest() -> None:
    assert VARIABLES.unknown_line(["flashsale_db_url", "FLASHSALE_LOGLEVEL"]) == (
        "flashsale_db_url: no such setting (did you mean FLASHSALE_DB__URL?); "
        "FLASHSALE_LOGLEVEL: no such setting (did you mean FLASHSALE_LOG_LEVEL?)"
    )


def test_the_serve_pid_variable_is_one_the_check_knows() -> None:
    assert SERVE_PID_ENV in OTHER_VARIABLES
