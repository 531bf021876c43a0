"""``flashsale teardown``: remove what one configuration made on the three servers
(:mod:`service.teardown`)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from service.cli.common import load_settings, run

if TYPE_CHECKING:
    from service.settings import Settings
    from service.teardown import Leftovers


def _lines(found: Leftovers, settings: Settings) -> list[str]:
    from service.startup import where

    lines = []
    if found.database is not None:
        lines.append(f"MySQL database {found.database} at {where(settings.db.url)}")
    if found.keys:
        lines.append(f"Redis: {found.keys} keys {found.pattern} at {where(settings.redis.url)}")
    for name, (messages, _) in found.queues.items():
        lines.append(f"RabbitMQ queue {name} ({messages} messages)")
    lines.extend(f"RabbitMQ exchange {name}" for name in found.exchanges)
    return lines


@click.command()
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--yes", is_flag=True, help="Remove without asking.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print what was found, then whether it was removed, as JSON lines."
)
def teardown(dry_run: bool, yes: bool, as_json: bool) -> None:
    """Remove what this configuration made: the database of FLASHSALE_DB__URL, the Redis keys
    under FLASHSALE_REDIS__KEY_PREFIX, the queues and exchanges of the FLASHSALE_AMQP__* names
    (their messages too). Another configuration's objects are not touched. Lists what it finds
    and asks first (--yes: does not ask). Refuses (exit 1) while a consumer or an API worker of
    this configuration runs: stop them first."""
    import msgspec

    from service.log_setup import configure_logging
    from service.teardown import remove, survey

    configure_logging("WARNING")
    settings = load_settings()
    found = run(survey(settings))
    if as_json:
        click.echo(msgspec.json.encode(found).decode())
    elif found.empty:
        click.echo("Nothing to remove: this configuration has nothing on the servers.")
    else:
        click.echo("\n".join(["This configuration has:", *(f"  {line}" for line in _lines(found, settings))]))
    if found.empty:
        return
    if dry_run:
        click.echo(json.dumps({"removed": False}) if as_json else "Dry run: nothing removed.")
        return
    if found.in_use:
        click.echo(f"flashsale teardown: still in use: {'; '.join(found.in_use)}. Stop them first.", err=True)
        sys.exit(1)
    if not yes:
        click.confirm("Remove all of this?", abort=True)
    run(remove(settings))
    click.echo(json.dumps({"removed": True}) if as_json else "Removed.")
