"""Run the Alembic migrations from code (the CLI, the embedded server and the tests use it)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

REPO = Path(__file__).resolve().parent.parent


def alembic_config(database_url: str) -> Config:
    cfg = Config(str(REPO / "alembic.ini")) if (REPO / "alembic.ini").is_file() else Config()
    cfg.set_main_option("script_location", str(REPO / "migrations"))
    cfg.attributes["database_url"] = database_url
    cfg.attributes["configure_logging"] = False
    return cfg


def migrate(database_url: str, revision: str = "head") -> None:
    """Upgrade to ``revision`` ("head" or an id), or downgrade everything with "base"."""
    cfg = alembic_config(database_url)
    if revision == "base":
        command.downgrade(cfg, "base")
    else:
        command.upgrade(cfg, revision)
