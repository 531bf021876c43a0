"""``flashsale migrate --current / --downgrade REV / --json`` and Alembic's own command line
through the repository's ``alembic.ini``, on a database of the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from db.migrate import alembic_config, drop_database
from toolkit.sale.isolation import environment

pytestmark = pytest.mark.slow  # runs CLI processes

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


@pytest.fixture
async def own_database(settings):
    url = make_url(settings.db.url)
    name = f"{url.database}_mig"
    own = settings.model_copy(
        update={"db": settings.db.model_copy(update={"url": url.set(database=name).render_as_string(False)})}
    )
    yield own
    await drop_database(own.db.url)


def _run(settings, *args: str, tool: str = "flashsale") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSALE_")}
    env.update(environment(settings))
    return subprocess.run(
        [str(BIN / tool), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def _json(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_migrate_current_downgrade_and_the_alembic_command_line(own_database):
    head = ScriptDirectory.from_config(alembic_config(own_database.db.url)).get_current_head()
    assert head is not None and head != "0001"
    assert _json(_run(own_database, "migrate", "--json"))["revision"] == head
    current = _json(_run(own_database, "migrate", "--current", "--json"))
    assert current["action"] == "current" and current["revision"] == head
    assert _json(_run(own_database, "migrate", "--downgrade", "0001", "--json"))["revision"] == "0001"
    alembic_current = _run(own_database, "current", tool="alembic")  # alembic.ini, FLASHSALE_DB__URL
    assert alembic_current.returncode == 0 and "0001" in alembic_current.stdout, alembic_current.stderr
    assert _run(own_database, "upgrade", "head", tool="alembic").returncode == 0
    assert _run(own_database, "migrate", "--current").stdout.strip().endswith(f"revision {head}")
    bad = _run(own_database, "migrate", "--downgrade", "nope")
    assert bad.returncode == 2 and "--downgrade" in bad.stderr
