"""The CLI's surface: help text on every option, --version, --json on every command that reports,
and the loop runner lets a command's own ImportError through once."""

from __future__ import annotations

import os

import click
import pytest
from click.testing import CliRunner

from service.cli.common import run as _run
from service.cli.main import main


def _commands(command: click.Command, path: tuple[str, ...] = ("flashsale",)):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def test_every_option_has_help_text():
    missing = [
        f"{' '.join(path)} {option.opts[0]}"
        for path, command in _commands(main)
        for option in command.params
        if isinstance(option, click.Option) and not option.help
    ]
    assert missing == []


REPORTING = ["realign", "sale", "bench", "migrate", "pay", "sweep", "product set"]


@pytest.mark.parametrize("name", REPORTING)
def test_every_command_that_reports_has_json(name):
    command = dict((" ".join(path[1:]), command) for path, command in _commands(main))[name]
    assert "--json" in [opt for param in command.params for opt in param.opts]


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == "flashsale 0.1.0"


def test_an_import_error_inside_a_command_is_raised_once_not_rerun():
    runs = []

    async def command() -> None:
        runs.append(1)
        raise ImportError("no module named 'aiomysql'")

    with pytest.raises(ImportError, match="aiomysql"):
        _run(command())
    assert runs == [1]


def _sale_options(monkeypatch, args: list[str]) -> dict:
    """The options ``flashsale sale ARGS`` hands to ``run_sale``."""
    import service.cli.trials as trials
    import toolkit.sale.job as job

    seen = {}

    async def run_sale(settings, **options):
        seen.update(options)
        return 0

    monkeypatch.setattr(job, "run_sale", run_sale)
    monkeypatch.setenv("FLASHSALE_ENV", "development")
    result = CliRunner().invoke(trials.sale, args)
    assert result.exit_code == 0, result.output
    return seen


@pytest.mark.parametrize(
    ("args", "users"),
    [([], 20_000), (["--waiting-room"], 2_000), (["--crowd"], 2_000), (["--waiting-room", "--users", "300"], 300)],
)
def test_a_crowd_is_smaller_by_default_than_a_sale(monkeypatch, args, users):
    """A crowd's scripts poll every 100 ms: its default size is what one box keeps up with."""
    assert _sale_options(monkeypatch, args)["users"] == users


@pytest.mark.parametrize(("args", "workers"), [([], os.cpu_count() or 1), (["--crowd-workers", "3"], 3)])
def test_the_crowd_has_one_worker_process_per_core_by_default(monkeypatch, args, workers):
    seen = _sale_options(monkeypatch, args)
    assert seen["crowd_workers"] == workers and seen["remote_workers"] == 0 and seen["web"] is False


def test_sale_worker_wants_the_master_as_host_and_port():
    import service.cli.trials as trials

    result = CliRunner().invoke(trials.sale_worker, ["--master", "10.0.0.1"])
    assert result.exit_code == 2 and "HOST:PORT" in result.output
