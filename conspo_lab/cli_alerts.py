"""``conspo-lab alerts …``: alert rules that tell a webhook (Slack, Discord, JSON) when a run
fails, finishes, stalls or a metric crosses a line; and ``conspo-lab answers`` (runs compared
problem by problem)."""

from __future__ import annotations

from typing import Annotated, Literal

import typer
from rich.table import Table

from conspo_lab.cli_client import TokenOpt, UrlOpt, _client, _fail, _parse_ints, console

alerts_app = typer.Typer(
    help="Alerts: a run fails, finishes, stalls or a metric crosses a line → a webhook."
)

Event = Literal["failed", "finished", "stalled", "metric"]


def register(app: typer.Typer) -> None:
    app.add_typer(alerts_app, name="alerts")
    app.command("answers")(answers)


@alerts_app.command("add")
def add(
    on: Annotated[Event, typer.Option("--on", help="failed, finished, stalled or metric.")],
    webhook: Annotated[
        str,
        typer.Option(
            envvar="CONSPO_ALERT_WEBHOOK",
            help="The webhook URL (a secret: better from CONSPO_ALERT_WEBHOOK than the command"
            " line, which other users of the machine may see).",
        ),
    ],
    run: Annotated[int | None, typer.Option(help="Watch this run.")] = None,
    study: Annotated[int | None, typer.Option(help="Watch this study's runs.")] = None,
    metric: Annotated[str | None, typer.Option(help="--on metric: its key.")] = None,
    below: Annotated[float | None, typer.Option(help="--on metric: a point below this.")] = None,
    above: Annotated[float | None, typer.Option(help="--on metric: a point above this.")] = None,
    nonfinite: Annotated[bool, typer.Option(help="--on metric: a NaN or ±Inf point.")] = False,
    stall_minutes: Annotated[float | None, typer.Option(help="--on stalled: minutes.")] = None,
    format: Annotated[
        Literal["slack", "discord", "json"], typer.Option(help="The body the webhook gets.")
    ] = "slack",
    name: Annotated[str, typer.Option(help="A name for the rule.")] = "",
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Add an alert rule (no --run or --study: every run of yours)."""
    chosen = [c for c, v in (("below", below), ("above", above)) if v is not None]
    if nonfinite:
        chosen.append("nonfinite")
    if len(chosen) > 1:
        _fail("give one of --below, --above, --nonfinite", code=2)
    comparison = chosen[0] if chosen else None
    threshold = below if below is not None else above
    with _client(url, token) as lab:
        rule = lab.create_alert(
            on, webhook, run_id=run, study_id=study, metric=metric, comparison=comparison,
            threshold=threshold, stall_minutes=stall_minutes, format=format, name=name,
        )  # fmt: skip
    console.print(
        f"alert #{rule['id']}: {_describe(rule)} on {rule['scope']} → {rule['webhook']}",
        highlight=False,
    )


def _describe(rule: dict[str, object]) -> str:
    if rule["event"] == "metric":
        if rule["comparison"] == "nonfinite":
            return f"{rule['metric']} not finite"
        return f"{rule['metric']} {rule['comparison']} {rule['threshold']:g}"
    if rule["event"] == "stalled":
        return f"stalled {rule['stall_minutes']:g} min"
    return str(rule["event"])


@alerts_app.command("list")
def list_rules(
    run: Annotated[int | None, typer.Option(help="Those that watch this run.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Your alert rules (webhooks shown by host only)."""
    with _client(url, token) as lab:
        rules = lab.alerts(run_id=run)
    table = Table("id", "name", "when", "scope", "webhook", "fired", "delivered", "failed")
    for r in rules:
        table.add_row(
            str(r["id"]), r["name"], _describe(r), r["scope"], f"{r['webhook']} ({r['format']})",
            str(r["fired"]), str(r["delivered"]), str(r["failed"]),
        )  # fmt: skip
    console.print(table)


@alerts_app.command("rm")
def remove(
    rule: Annotated[int, typer.Argument(help="Alert rule id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete an alert rule."""
    with _client(url, token) as lab:
        lab.delete_alert(rule)
    console.print(f"alert #{rule} deleted")


@alerts_app.command("test")
def test(
    rule: Annotated[int, typer.Argument(help="Alert rule id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Call the rule's webhook once now with a test message."""
    with _client(url, token) as lab:
        out = lab.test_alert(rule)
    if not out["delivered"]:
        _fail(f"not delivered: {out['error']}", code=1)
    console.print(f"alert #{rule}: the webhook took the test message")


@alerts_app.command("fired")
def fired(
    run: Annotated[int | None, typer.Option(help="Only for this run.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """What your rules fired, newest first, and whether each webhook took it."""
    with _client(url, token) as lab:
        firings = lab.alert_firings(run_id=run, limit=limit)
    table = Table("id", "rule", "run", "what", "delivery")
    for f in firings:
        state = f["state"] + (f" ({f['last_error']})" if f["last_error"] else "")
        table.add_row(str(f["id"]), str(f["rule_id"]), str(f["run_id"]), f["message"], state)
    console.print(table)


def answers(
    runs: Annotated[str, typer.Argument(help="Run ids, comma-separated (2 or more to compare).")],
    step: Annotated[str, typer.Option(help="last, first or a step every run evaluated.")] = "last",
    source: Annotated[str, typer.Option(help="held_out or a benchmark's name.")] = "held_out",
    show: Annotated[
        Literal["all", "disagree", "regressed", "all_wrong", "all_right"],
        typer.Option(help="Which problems to list."),
    ] = "disagree",
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Runs' held-out answers problem by problem: who solved what, and McNemar's p per pair."""
    ids = _parse_ints(runs, "RUNS")
    with _client(url, token) as lab:
        out = lab.answers(ids, step=step, source=source, show=show, limit=limit)
    for r in out["runs"]:
        console.print(
            f"run {r['id']} {r['name']}: {r['solved']}/{r['problems']} solved at step {r['step']}",
            highlight=False,
        )
    for pair in out["pairs"]:
        console.print(
            f"run {pair['a']} alone: {pair['a_only']}, run {pair['b']} alone: {pair['b_only']},"
            f" both: {pair['both']}, neither: {pair['neither']}"
            f" (McNemar p = {pair['mcnemar_p']:.3g})",
            highlight=False,
        )
    table = Table("problem", *(f"run {r['id']}" for r in out["runs"]))
    for p in out["problems"]:
        marks = []
        for r in out["runs"]:
            a = p["answers"].get(str(r["id"]))
            marks.append("–" if a is None else ("✓" if a["solved"] else "✗"))
        table.add_row(p["prompt"][:80].replace("\n", " "), *marks)
    console.print(table)
    console.print(f"{len(out['problems'])} of {out['total']} problems ({show})", highlight=False)
