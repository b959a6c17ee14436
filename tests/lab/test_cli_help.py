"""``conspo-lab --help`` and every command's ``--help`` read as a user needs them: flags show no
type (a flag takes no value), positionals are named in capitals, the two exports say what each
exports, and no default is cut off."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from conspo.metrics import KEY_METRICS
from conspo_lab.cli import app

runner = CliRunner()
WIDTH = {"COLUMNS": "100"}  # an ordinary terminal: the help tables wrap, as for a user


def command_paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command and group of the CLI (Typer's own click objects), as the arguments that
    reach it."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from command_paths(sub, (*path, name))


ALL_COMMANDS = list(command_paths(typer.main.get_command(app)))


def helped(*path: str) -> str:
    result = runner.invoke(app, [*path, "--help"], env=WIDTH)
    assert result.exit_code == 0, result.output
    return result.output


def usage_line(text: str) -> str:
    return next(line for line in text.splitlines() if "Usage:" in line)


def test_the_cli_has_the_commands_this_file_reads() -> None:
    assert {("export",), ("models", "export"), ("compare",), ("submit",), ("serve",)} <= set(
        ALL_COMMANDS
    )


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p) or "conspo-lab")
def test_flags_show_no_type_and_positionals_read_in_capitals(path: tuple[str, ...]) -> None:
    text = helped(*path)
    assert "<bool>" not in text, text
    usage = usage_line(text)
    assert "{" not in usage and "}" not in usage, usage
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    for param in command.params:
        if param.param_type_name == "argument":
            shown = param.metavar or (param.name or "").upper()  # RUN..., CONFIG, RUN_ID
            assert re.search(rf"\s{re.escape(shown)}(\s|$)", usage), (shown, usage)


def test_submit_names_its_config_file() -> None:
    text = helped("submit")
    assert usage_line(text).rstrip().endswith("[OPTIONS] CONFIG"), usage_line(text)
    assert "Run config, YAML or JSON" in text


def test_the_two_exports_say_what_each_exports() -> None:
    """`export` writes a run's metrics, `models export` a checkpoint: the top-level list, and
    each command's own help, tell them apart and point at the other."""
    top = helped()
    listed = {m.group(1): m.group(2) for m in re.finditer(r"│ (export|models)\s+(.+?)\s*│", top)}
    assert "metrics" in listed["export"] and "checkpoint" not in listed["export"], listed
    assert "checkpoint" in listed["models"] and "models export" in listed["models"], listed
    metrics = helped("export")
    assert "a run's metrics" in metrics and "models export" in metrics
    checkpoint = " ".join(helped("models", "export").split())
    assert "model checkpoint as a Hugging Face model directory" in checkpoint
    assert "conspo-lab export RUN" in checkpoint


def test_compare_shows_its_default_keys_in_full() -> None:
    text = helped("compare")
    assert "…" not in text, text
    words = set(re.findall(r"[\w/@.]+", text))
    assert set(KEY_METRICS) <= words, sorted(set(KEY_METRICS) - words)
