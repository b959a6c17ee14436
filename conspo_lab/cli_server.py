"""Server-side commands: serve, worker, migrate, token create (owned by the platform work)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
