"""The ``flashsale`` console script: the group and its error handling; the commands live in one
module per group (:mod:`service.cli.processes`: serve, consume, realign, sweep;
:mod:`service.cli.trials`: sale, bench; :mod:`service.cli.payments`: pay, channel, payments,
reconcile; :mod:`service.cli.admin`: migrate, product, token; :mod:`service.cli.dlq`: dlq;
:mod:`service.cli.teardown`: teardown)."""

from __future__ import annotations

from typing import Any

import click

from service.cli import admin, payments, processes, trials
from service.cli.common import load_settings
from service.cli.dlq import dlq
from service.cli.teardown import teardown


class FlashsaleGroup(click.Group):
    """The ``flashsale`` group: a configuration error (an invalid setting, a store its URL does
    not reach, a development secret outside development mode) ends the command with one line on
    stderr naming the variable, exit code 2; a use case's refusal (:class:`DomainError`, e.g. a
    product whose realignment lock another pass holds) with one line, exit code 1; ``--debug``
    shows the traceback instead."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            if ctx.meta.get("flashsale.debug"):
                raise
            problem = _config_problem(exc)
            if problem is None:
                from service.domain.errors import DomainError

                if isinstance(exc, DomainError):  # e.g. a product another realignment pass holds
                    click.echo(f"flashsale: {exc}", err=True)
                    ctx.exit(1)
                raise
            click.echo(f"flashsale: configuration error: {problem}", err=True)
            ctx.exit(2)


def _config_problem(exc: Exception) -> str | None:
    from service.environment_errors import ConfigError

    if isinstance(exc, ConfigError):
        return str(exc)
    try:
        settings = load_settings()
    except ConfigError:
        return None
    from service.startup import unreachable

    problem = unreachable(exc, settings)
    return None if problem is None else str(problem)


@click.group(cls=FlashsaleGroup)
@click.version_option(package_name="flashsale", message="flashsale %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line configuration errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """flashsale: inventory-aware order service for flash sales."""
    ctx.meta["flashsale.debug"] = debug


for command in (
    processes.serve,
    processes.consume,
    processes.realign,
    processes.sweep,
    trials.sale,
    trials.sale_worker,
    trials.bench,
    payments.pay,
    payments.channel,
    payments.payments,
    payments.reconcile,
    admin.migrate,
    admin.product,
    admin.token,
    dlq,
    teardown,
):
    main.add_command(command)

if __name__ == "__main__":
    main()
