"""Client-side commands: submit, runs, watch, compare, export (owned by the shipping work)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
