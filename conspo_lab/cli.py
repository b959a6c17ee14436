"""``conspo-lab``: one Typer app assembled from the server-side and client-side command modules."""

from __future__ import annotations

import typer

app = typer.Typer(help="ConSPO Lab: RLVR experiment platform.", no_args_is_help=True)


def _register_commands() -> None:
    # Each module adds its commands to `app`; importing them here keeps `conspo-lab --help` whole.
    from conspo_lab import cli_client, cli_pipeline, cli_server, cli_study

    cli_server.register(app)
    cli_client.register(app)
    cli_study.register(app)
    cli_pipeline.register(app)


_register_commands()

if __name__ == "__main__":
    app()
