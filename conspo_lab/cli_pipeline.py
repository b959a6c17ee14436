"""``conspo-lab pipeline`` and ``conspo-lab models``: chained stages, and the model registry.

    conspo-lab pipeline run sft_then_conspo.yaml --wait  # stages queued in turn; a table at the end
    conspo-lab pipeline show 3                           # stages, runs, start → end evals
    conspo-lab pipeline cancel 3                         # current stage stops, the rest never run
    conspo-lab models                                    # finished runs' checkpoints, lineage, eval
    conspo-lab models export 12 [--step best]            # a Hugging Face directory on the server
    conspo-lab models download 12 [--into DIR]           # that directory here, resumable, checked

A pipeline file is YAML or JSON with the fields of ``POST /api/pipelines``: ``name``, ``stages``
(a list of run configs, as ``conspo-lab submit`` takes; each stage after the first starts from the
previous stage's checkpoint) and optional ``tags``. Every stage is validated here before anything
is sent. Exit codes as the other commands: 0 ok, 1 server failure, 2 bad input.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from conspo_lab.cli_client import (
    TokenOpt,
    UrlOpt,
    _client,
    _fail,
    _format_validation,
    _read_mapping,
    console,
)

pipeline_app = typer.Typer(help="Pipelines: stages (SFT → RL, …) run one after the other.")
models_app = typer.Typer(
    help="Finished runs' model checkpoints: list them; `models export RUN_ID` exports one as a"
    " model directory, `models download RUN_ID` downloads it.",
    invoke_without_command=True,
)
ENDED = ("succeeded", "failed", "cancelled")


def register(app: typer.Typer) -> None:
    app.add_typer(pipeline_app, name="pipeline")
    app.add_typer(models_app, name="models")


def _load(path: Path) -> dict[str, Any]:
    """The pipeline file, each stage validated as a RunConfig (all problems in one message)."""
    from conspo.config import RunConfig

    shape = "a pipeline file is a mapping with name and stages (a list)"
    data = _read_mapping(path, shape)
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages or not isinstance(data.get("name"), str):
        return _fail(f"{path}: {shape}", code=2)
    problems = []
    for i, stage in enumerate(stages):
        try:
            RunConfig.model_validate(stage)
        except ValidationError as exc:
            problems.append(f"stage {i + 1} is not a valid run config:\n{_format_validation(exc)}")
    if problems:
        return _fail(f"{path}: " + "\n".join(problems), code=2)
    return data


@pipeline_app.command("run")
def run(
    file: Annotated[Path, typer.Argument(help="Pipeline file, YAML or JSON.")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow until every stage ends; print the stages.")
    ] = False,
    poll_s: Annotated[float, typer.Option(help="Seconds between polls with --wait.")] = 5.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Submit the stages as one pipeline; stage 1 is queued now, each next one when it succeeds."""
    spec = _load(file)
    with _client(url, token) as lab:
        p = lab.create_pipeline(spec["name"], spec["stages"], spec.get("tags") or [])
        first = p["stages"][0]["run"]
        console.print(
            f"pipeline {p['id']} created: {len(p['stages'])} stages, stage 1 is run {first['id']}"
            f" (page: /pipelines/{p['id']})",
            highlight=False,
        )
        if not wait:
            return
        seen = ""
        while p["status"] not in ENDED:
            time.sleep(poll_s)
            p = lab.get_pipeline(p["id"])
            now = _progress(p)
            if now != seen:
                console.print(f"  {now}", highlight=False)
                seen = now
        _print_pipeline(p)
    if p["status"] != "succeeded":
        raise typer.Exit(1)


def _progress(p: dict[str, Any]) -> str:
    return ", ".join(
        f"stage {s['stage'] + 1}: {s['run']['status'] if s['run'] else 'waiting'}"
        for s in p["stages"]
    )


@pipeline_app.command("show")
def show(
    pipeline_id: Annotated[int, typer.Argument(help="Pipeline id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Each stage's run and status, where it started from, its first and last evaluation."""
    with _client(url, token) as lab:
        _print_pipeline(lab.get_pipeline(pipeline_id))


@pipeline_app.command("cancel")
def cancel(
    pipeline_id: Annotated[int, typer.Argument(help="Pipeline id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel the current stage; the later stages never run."""
    with _client(url, token) as lab:
        p = lab.cancel_pipeline(pipeline_id)
    console.print(f"pipeline {pipeline_id}: {p['status']}", highlight=False)


def _evals(point: dict[str, Any] | None) -> str:
    if not point:
        return "–"
    values = " ".join(f"{k.removeprefix('eval/')}={v:.4g}" for k, v in point["values"].items())
    return f"step {point['step']}: {values}"


def _print_pipeline(p: dict[str, Any]) -> None:
    console.print(f"[bold]pipeline {p['id']}: {p['name']}[/] ({p['status']})")
    table = Table("stage", "trains", "run", "status", "from", "eval at start", "eval at end")
    for s in p["stages"]:
        run, source, ev = s["run"], s["from"], s["eval"] or {}
        table.add_row(
            str(s["stage"] + 1),
            s["label"],
            f"#{run['id']} {run['name']}" if run else "–",
            run["status"] if run else ("not run" if s["skipped"] else "waiting"),
            f"#{source['run']} ({source['step']})" if source["run"] else str(source["base"]),
            _evals(ev.get("start")),
            _evals(ev.get("end")),
        )
    console.print(table)


@models_app.callback()
def models(ctx: typer.Context, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """List the registry: run, kind, lineage back to the base model, checkpoints, last eval."""
    if ctx.invoked_subcommand is not None:
        return
    with _client(url, token) as lab:
        entries = lab.models()
    table = Table("run", "kind", "lineage", "checkpoints", "eval", title="models")
    for m in entries:
        lineage = " ← ".join(
            str(x["base"]) if "base" in x else f"#{x['run']} ({x['step']})" for x in m["lineage"]
        )
        checkpoints = ", ".join(
            f"{w} (step {c['step']})" if c["step"] is not None else w
            for w, c in m["checkpoints"].items()
        )
        evals = " ".join(f"{k.removeprefix('eval/')}={v:.4g}" for k, v in m["eval"].items())
        table.add_row(f"#{m['run_id']} {m['name']}", m["label"], lineage, checkpoints, evals or "–")
    console.print(table)
    if not entries:
        console.print("no finished run has a checkpoint yet")


@models_app.command("export")
def export(
    run_id: Annotated[int, typer.Argument(help="The run whose checkpoint to export.")],
    step: Annotated[str, typer.Option(help="last, best or a kept step number.")] = "last",
    download: Annotated[
        Path | None,
        typer.Option(help="Also download it into this directory (here, unpacked)."),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Export a run's model checkpoint as a Hugging Face model directory (LoRA merged).

    The directory is written on the server; its path is printed. With --download DIR it is
    also downloaded into DIR and the local directory printed. The run's metrics are
    `conspo-lab export RUN`."""
    which: str | int = int(step) if step.isdigit() else step
    with _client(url, token) as lab:
        path = (
            lab.download_model(run_id, download, which)
            if download
            else lab.export_model(run_id, which)
        )
    console.print(str(path), highlight=False, soft_wrap=True)


@models_app.command("download")
def download(
    run_id: Annotated[int, typer.Argument(help="The run whose checkpoint to download.")],
    step: Annotated[str, typer.Option(help="last, best or a kept step number.")] = "last",
    into: Annotated[
        Path, typer.Option(help="The directory to unpack it in (created if need be).")
    ] = Path("."),
    retries: Annotated[
        int, typer.Option(min=0, help="Dropped connections in a row to go on from.")
    ] = 5,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Download a run's model checkpoint as a Hugging Face model directory (exported first).

    The tar is saved as DIR/.run-<id>-<step>.tar.part until it is whole: a dropped connection
    goes on from there (HTTP ranges), and so does running the command again. Its SHA-256 is
    checked against the server's before it is unpacked; the model directory and the checksum
    are printed."""
    which: str | int = int(step) if step.isdigit() else step
    with _client(url, token) as lab:
        got = lab.fetch_model(run_id, into, which, retries=retries)
    console.print(str(got.path.resolve()), highlight=False, soft_wrap=True)
    console.print(f"sha256 {got.sha256}  ({got.size:,} bytes)", highlight=False, soft_wrap=True)
