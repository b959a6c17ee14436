"""``conspo-lab``: one Typer app assembled from the server-side and client-side command modules."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def _readable(params: list[Any]) -> list[Any]:
    """``params`` as ``--help`` should spell them. Typer's rich help gives every flag a type
    (``--embedded <bool>``), though a flag takes no value: it gets none. A positional reads as
    its name in capitals (``CONFIG``, ``RUN_ID``), as man pages and argparse write one, not as
    Typer's ``{config}``."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
        elif isinstance(param, TyperArgument) and param.metavar is None:
            param.metavar = (param.name or "value").upper() + ("..." if param.nargs != 1 else "")
    return params


class ReadableCommand(TyperCommand):
    """A command whose help spells its parameters as ``_readable`` says, in the usage line too:
    ``conspo-lab submit [OPTIONS] CONFIG``, an optional positional in brackets."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _readable(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                shown = param.metavar or ""  # set by _readable
                pieces.append(shown if param.required else f"[{shown}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


class ReadableGroup(TyperGroup):
    """A command group whose own options (``--help``, completion) are spelled as ``_readable``
    says."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _readable(super().get_params(ctx))


def _readable_everywhere(typer_app: typer.Typer) -> None:
    """Every command and sub-group registered on ``typer_app`` (recursively) gets the readable
    help classes, so no command module has to name them."""
    for command in typer_app.registered_commands:
        if command.cls in (None, TyperCommand):  # Typer's default, not a class of our own
            command.cls = ReadableCommand
    for group in typer_app.registered_groups:
        group.cls = ReadableGroup
        if group.typer_instance is not None:
            _readable_everywhere(group.typer_instance)


app = typer.Typer(
    help="ConSPO Lab: RLVR experiment platform.", no_args_is_help=True, cls=ReadableGroup
)


@app.callback()
def _plugins_at_start() -> None:
    """A plugin that fails to import is named at once, not found out as an "unknown task"
    later (CONSPO_PLUGINS and the conspo.plugins entry points: conspo.plugins)."""
    import logging

    from conspo import plugins

    if not plugins.declared():
        return
    # Said once, below, in the CLI's own words (not also by logging's last-resort handler).
    logging.getLogger(plugins.__name__).addHandler(logging.NullHandler())
    for plugin in plugins.failed():
        typer.echo(f"conspo-lab: plugin {plugin.name!r} failed to load: {plugin.error}", err=True)


def _register_commands() -> None:
    # Each module adds its commands to `app`; importing them here keeps `conspo-lab --help` whole.
    from conspo_lab import cli_alerts, cli_client, cli_pipeline, cli_server, cli_study

    cli_server.register(app)
    cli_client.register(app)
    cli_study.register(app)
    cli_pipeline.register(app)
    cli_alerts.register(app)
    _readable_everywhere(app)


_register_commands()

if __name__ == "__main__":
    app()
