"""``conspo-lab study``: run a study file, show a study's verdict, export its report.

    conspo-lab study check study.yaml          # every check the submit makes; nothing stored
    conspo-lab study run study.yaml --wait     # submit, follow until done, print the verdict
    conspo-lab study show 3                    # per-arm table, paired differences, verdict
    conspo-lab study report 3 -o study-3.html  # one self-contained HTML file (--csv: objective)

A study file is YAML or JSON with the fields of ``POST /api/studies`` (backend.studies.spec
documents them with a ten-line example). Exit codes as the other commands: 0 ok, 1 server
failure, 2 bad input.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from conspo_lab.cli_client import TokenOpt, UrlOpt, _client, _read_mapping, console

study_app = typer.Typer(help="Studies: arms × seeds and a verdict with its uncertainty.")


def register(app: typer.Typer) -> None:
    app.add_typer(study_app, name="study")


def _load(path: Path) -> dict[str, Any]:
    return _read_mapping(path, "a study file is a mapping (name, config, arms, seeds, …)")


@study_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="Study file, YAML or JSON.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Check a study file as `study run` would submit it, storing nothing: the runs it plans,
    or each bad field (exit 2)."""
    spec = _load(file)
    with _client(url, token) as lab:
        plan = lab.check_study(spec)
    tasks = f" × {len(plan['tasks'])} tasks" if plan["tasks"] else ""
    arms = f"{len(plan['arms'])} arms" if plan["arms"] else "a search"
    tuning = f" + {plan['tuning_runs']} tuning runs" if plan.get("tuning_runs") else ""
    console.print(
        f"ok: {plan['runs']} runs ({arms}{tasks} × {len(plan['seeds'])} seeds{tuning}),"
        f" baseline {plan['baseline'] or '–'}",
        highlight=False,
    )
    if plan.get("text"):  # the budget: runs of each phase, tokens, time from earlier runs
        console.print(f"budget: {plan['text']}", highlight=False)


@study_app.command("run")
def run(
    file: Annotated[Path, typer.Argument(help="Study file, YAML or JSON.")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow until done; print the verdict.")
    ] = False,
    poll_s: Annotated[float, typer.Option(help="Seconds between polls with --wait.")] = 5.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Submit a study; its runs are queued as its concurrency allows."""
    spec = _load(file)
    with _client(url, token) as lab:
        study = lab.create_study(spec)
        console.print(
            f"study {study['id']} created: {len(study['runs'])} runs planned, "
            f"{study['counts'].get('queued', 0)} queued (page: /studies/{study['id']})"
        )
        if not wait:
            return
        while study["status"] == "active":
            time.sleep(poll_s)
            study = lab.get_study(study["id"])
            # progress counts both phases of a tuned study (its runs are the final phase's)
            planned = study["progress"]
            phase = (study.get("tuning") or {}).get("phase")
            console.print(
                f"  {planned['ended']} of {planned['runs']} runs finished"
                + (f" ({phase} phase)" if phase else ""),
                highlight=False,
            )
        _print_study(study)


@study_app.command("show")
def show(
    study_id: Annotated[int, typer.Argument(help="Study id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """The verdict, per-arm objective (mean, 95% CI, n) and paired differences."""
    with _client(url, token) as lab:
        _print_study(lab.get_study(study_id))


@study_app.command("report")
def report(
    study_id: Annotated[int, typer.Argument(help="Study id.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="File to write.")],
    csv: Annotated[
        bool, typer.Option("--csv", help="The per-seed objective as CSV instead.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Write the study's self-contained HTML report (or its objective CSV)."""
    with _client(url, token) as lab:
        text = lab.study_objective_csv(study_id) if csv else lab.study_report(study_id)
    output.write_text(text)
    console.print(f"wrote {output} ({len(text):,} bytes)")


@study_app.command("cancel")
def cancel(
    study_id: Annotated[int, typer.Argument(help="Study id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Drop the pending runs, cancel the queued and running ones."""
    with _client(url, token) as lab:
        study = lab.cancel_study(study_id)
    console.print(f"study {study_id}: {study['status']}")


def _ci(ci: list[float] | None, scale: float) -> str:
    return "–" if not ci else f"[{ci[0] * scale:.3g}, {ci[1] * scale:.3g}]"


def _print_study(study: dict[str, Any]) -> None:
    scale = study["objective"]["scale"] or 1
    console.print(f"[bold]study {study['id']}: {study['name']}[/] ({study['status']})")
    for arm in (study.get("tuning") or {}).get("arms", []):
        pick = arm["pick"]
        if pick is None:
            console.print(f"  {arm['arm']}: tuning, {len(arm['trials'])} trials asked")
            continue
        chosen = ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in pick["params"].items()
        )
        trial = "its own overrides" if pick["trial"] is None else f"t{pick['trial']} ({chosen})"
        console.print(f"  {arm['arm']} tuned: {trial}; {pick['confidence']}", highlight=False)
    for line in study["verdict"]:
        console.print(f"  {line}", highlight=False)
    arms = Table("arm", "n", "mean", "95% CI (t)", "95% CI (bootstrap)", title="objective by arm")
    for a in study["arms"]:
        mean = "–" if a["mean"] is None else f"{a['mean'] * scale:.4g}"
        arms.add_row(
            a["name"],
            f"{a['n']} of {a['planned']}",
            mean,
            _ci(a["ci_t"], scale),
            _ci(a["ci_boot"], scale),
        )
    console.print(arms)
    if study["pairs"]:
        pairs = Table(
            "arm − baseline",
            "n",
            "mean d",
            "95% CI (paired t)",
            "p (paired t: decides)",
            "p (Wilcoxon: robustness check)",
            "wins/ties/losses",
            "dropped seeds",
        )
        for p in study["pairs"]:
            mean = "–" if p["mean_d"] is None else f"{p['mean_d'] * scale:+.3g}"
            pairs.add_row(
                f"{p['arm']} − {p['baseline']}",
                str(p["n"]),
                mean,
                _ci(p["ci_t"], scale),
                "–" if p["p_t"] is None else f"{p['p_t']:.3g}",
                "–" if p["p_wilcoxon"] is None else f"{p['p_wilcoxon']:.3g}",
                f"{p['wins']}/{p['ties']}/{p['losses']}",
                ", ".join(map(str, p["dropped"])) or "none",
            )
        console.print(pairs)
