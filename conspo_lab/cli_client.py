"""Client-side commands: submit, runs, watch, compare, export.

Every command talks to a server through ``conspo_lab.client.Client``: ``--url`` / ``CONSPO_URL``
(default http://127.0.0.1:8000) and ``--token`` / ``CONSPO_TOKEN`` (default: the embedded server's
``data/token`` file when present). Exit codes: 0 ok, 1 server or run failure, 2 bad input.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from conspo import metrics as M
from conspo.spreadsheet import neutralised
from conspo_lab.client import ApiError, Client, Run, Series, ServerUnavailable

console = Console()
err_console = Console(stderr=True)

# The metrics `watch` and `compare` show by default, and the two the run list shows.
KEY_METRICS = M.KEY_METRICS
LIST_METRICS = (M.SEP_GAP, M.BATCH_PASS_RATE)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="CONSPO_URL", help="Server URL (default: http://127.0.0.1:8000)."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="CONSPO_TOKEN", help="API token (default: data/token if present)."
    ),
]


class ExportFormat(StrEnum):
    csv = "csv"
    jsonl = "jsonl"
    parquet = "parquet"


class Layout(StrEnum):
    wide = "wide"
    long = "long"


def register(app: typer.Typer) -> None:
    app.command()(submit)
    app.command()(runs)
    app.command()(watch)
    app.command()(cancel)
    app.command()(compare)
    app.command()(export)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def submit(
    config: Annotated[Path, typer.Argument(help="Run config, YAML or JSON (see docs/config.md).")],
    seeds: Annotated[
        str | None, typer.Option(help="Comma list of seeds: one run per seed, e.g. 0,1,2.")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Tag the runs (repeatable).")] = None,
    name: Annotated[str | None, typer.Option(help="Run name (default: config's name).")] = None,
    watch_run: Annotated[
        bool, typer.Option("--watch", help="Follow the first run until it ends.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Validate a config file locally, then queue it (one run per seed)."""
    from conspo.config import RunConfig

    try:
        cfg = RunConfig.from_file(config)
    except FileNotFoundError:
        _fail(f"{config}: no such file", code=2)
    except ValidationError as exc:
        _fail(f"{config} is not a valid run config:\n{_format_validation(exc)}", code=2)
    except (ValueError, OSError) as exc:  # YAML/JSON syntax errors
        _fail(f"{config}: cannot read it: {exc}", code=2)
    seed_list = _parse_ints(seeds, "--seeds") if seeds else None
    with _client(url, token) as lab:
        sub = lab.create_runs(cfg, seeds=seed_list, tags=tag or [], name=name)
        ids = ", ".join(str(r.id) for r in sub.runs)
        group = f" (group {sub.group_id})" if sub.group_id else ""
        console.print(f"queued run{'s' if len(sub.runs) > 1 else ''} {ids}{group}")
        for r in sub.runs:
            console.print(f"  {lab.base_url}/runs/{r.id}", soft_wrap=True, highlight=False)
        if watch_run and sub.runs:
            _follow(lab, sub.runs[0].id)


def runs(
    status: Annotated[
        str | None, typer.Option(help="queued, running, succeeded, failed or cancelled.")
    ] = None,
    algorithm: Annotated[str | None, typer.Option(help="Only this algorithm.")] = None,
    tag: Annotated[str | None, typer.Option(help="Only runs with this tag.")] = None,
    group: Annotated[str | None, typer.Option(help="Only this submission group id.")] = None,
    q: Annotated[str | None, typer.Option(help="Name substring.")] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="Conditions on config fields and metric summaries, ANDed, e.g."
            " 'params.tau>=5 AND best(eval/accuracy)>0.2' (docs/api.md, Finding runs)."
        ),
    ] = None,
    order_by: Annotated[
        str | None,
        typer.Option(
            help="A config path or metric summary to order by, '-' first for the largest"
            " first: '-max(system/peak_rss_gib)', 'params.tau'."
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).")] = 50,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List runs as a table."""
    with _client(url, token) as lab:
        page = lab.list_runs(
            status=status,
            algorithm=algorithm,
            tag=tag,
            group_id=group,
            q=q,
            where=where,
            order_by=order_by,
            sort="-created_at",
            limit=limit,
        )
    table = Table(title=f"runs ({len(page.items)} of {page.total})")
    for col in ("id", "name", "status", "algorithm", "task", "model", "seed", "step", "tags"):
        table.add_column(col, justify="right" if col in {"id", "seed", "step"} else "left")
    for key in LIST_METRICS:
        table.add_column(key, justify="right")
    for run in page.items:
        table.add_row(
            str(run.id),
            run.name or "",
            _status_text(run),
            run.algorithm or run.kind or "",
            run.task or "",
            run.model or "",
            "" if run.seed is None else str(run.seed),
            f"{run.step}/{run.total_steps or '?'}"
            + ("" if run.eta_s is None else f"\n[dim]ETA {_duration(run.eta_s)}[/]"),
            ",".join(run.tags),
            *(_fmt(run.summary.get(key)) for key in LIST_METRICS),
        )
    # Piped or redirected: every column in full (a terminal's width does not apply to a file).
    (console if console.is_terminal else Console(width=1000)).print(table)


def cancel(
    run: Annotated[int, typer.Argument(help="Run id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel a run: a queued one at once, a running one within seconds (its worker stops)."""
    with _client(url, token) as lab:
        before = lab.get_run(run)
        if before.finished:
            _fail(f"run {run} is already {before.status}; nothing to cancel", code=1)
        after = lab.cancel(run)
    state = (
        "cancelled" if after.status == "cancelled" else "cancel requested (stops within seconds)"
    )
    console.print(f"run {after.id} {after.name or ''}: {state}", highlight=False)


def watch(
    run: Annotated[int, typer.Argument(help="Run id.")],
    since_step: Annotated[
        int | None, typer.Option(help="Start after this step (default: from the beginning).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Follow a run live: progress bar and key metrics until it ends (exit 1 unless succeeded)."""
    with _client(url, token) as lab:
        final = _follow(lab, run, since_step)
    if final.status != "succeeded":
        raise typer.Exit(1)


def compare(
    run_ids: Annotated[list[int], typer.Argument(metavar="RUN...", help="Run ids (up to 50).")],
    keys: Annotated[
        str | None,
        # The default spelled with spaces: a help column wraps it whole (one 80-character word
        # was cut with an ellipsis).
        typer.Option(help=f"Comma list of keys (default: {', '.join(KEY_METRICS)})."),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(
            help="Write a self-contained HTML report (groups, each against the baseline group"
            " with its CI, curves) to this file instead; '.csv': each run's last-3 mean."
        ),
    ] = None,
    group: Annotated[
        str, typer.Option(help="With --report: group by algorithm, task, model or a config path.")
    ] = "algorithm",
    baseline: Annotated[
        str | None, typer.Option(help="With --report: the baseline group, e.g. algorithm=grpo.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Table of each key's last value, mean of the last 3 and extreme per run.

    The extreme (max, or min where lower is better) of a noisy series is not its "best": it is
    the luckiest step. The mean of the last 3 values is the steadier summary (a study compares
    runs by such an objective with a confidence interval: ``conspo-lab study``).
    With ``--report out.html`` the runs are grouped and set against a baseline group (paired by
    seed where the seeds match) on the first key, in one file that opens offline."""
    key_list = _split(keys) if keys else list(KEY_METRICS)
    if report is not None:
        with _client(url, token) as lab:
            text = lab.compare_report(
                run_ids,
                key_list[0] if keys else "eval/accuracy",
                group=group,
                baseline=baseline,
                csv=report.suffix.lower() == ".csv",
            )
        report.write_text(text)
        console.print(f"wrote {report}")
        return
    with _client(url, token) as lab:
        info = {rid: lab.get_run(rid) for rid in run_ids}
        series = lab.compare(run_ids, key_list, max_points=10_000)
    table = Table(
        title="compare (extreme: max, or min where lower is better; none for descriptive keys;"
        " keys the catalogue lacks: min for loss-like names. A noisy series' extreme is its"
        " luckiest step, not its best: compare last-3 means, or run a study)"
    )
    for col in ("key", "run", "status", "last", "last-3 mean", "extreme", "at step", "points"):
        table.add_column(col, justify="left" if col in {"key", "run", "status"} else "right")
    for key in key_list:
        for i, rid in enumerate(run_ids):
            run = info[rid]
            s = series.get(rid, {}).get(key)
            last, best, best_step, points = _last_best(run, key, s)
            table.add_row(
                key if i == 0 else "",
                f"{rid} {run.name or ''}".strip(),
                _status_text(run),
                _fmt(last),
                _fmt(_mean_last(s, 3)),
                _fmt(best),
                "" if best_step is None else str(best_step),
                str(points),
                end_section=i == len(run_ids) - 1,
            )
    console.print(table)


def export(
    run: Annotated[int, typer.Argument(help="Run id.")],
    fmt: Annotated[ExportFormat, typer.Option("--format", help="File format.")] = (
        ExportFormat.csv
    ),
    out: Annotated[
        Path | None, typer.Option(help="Output file (default run-<id>.<format>; '-': stdout).")
    ] = None,
    layout: Annotated[
        Layout,
        typer.Option(
            help="wide: one row per step, one column per key; long: one row per (key, step)."
        ),
    ] = Layout.wide,
    keys: Annotated[str | None, typer.Option(help="Comma list of keys (default: all).")] = None,
    answers: Annotated[
        bool,
        typer.Option(
            "--answers",
            help="Its evaluations' problems instead (one row per kept evaluation and problem:"
            " step, source, solved, score, the answer's text).",
        ),
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Export a run's metrics (every logged step) as CSV, JSON lines or Parquet; with
    --answers, its evaluations' problems.

    `conspo-lab models export RUN_ID` exports a run's model checkpoint."""
    if answers:
        _export_answers(run, fmt, out, url, token)
        return
    with _client(url, token) as lab:
        key_list = _split(keys) if keys else lab.metric_keys(run)
        series = _all_points(lab, run, key_list)
    rows, columns = (
        _wide_rows(series, key_list) if layout is Layout.wide else _long_rows(run, series)
    )
    if not rows:
        _fail(f"run {run} has no metric points{' for those keys' if keys else ''}: nothing to"
              " export", code=1)  # fmt: skip
    target = out or Path(f"run-{run}.{fmt.value}")
    if str(target) == "-" and fmt is ExportFormat.parquet:
        _fail("parquet cannot go to stdout; give --out FILE", code=2)
    _write_rows(rows, columns, fmt, target)
    where = "stdout" if str(target) == "-" else str(target)
    err_console.print(
        f"wrote {len(rows)} rows to {where} ({layout.value} layout: "
        + (
            "one row per step, one column per key)"
            if layout is Layout.wide
            else "one row per run, key, step)"
        )
    )


ANSWER_COLUMNS = [
    "step", "source", "position", "problem_key", "solved", "score", "samples",
    "samples_correct", "prompt", "reference", "answer",
]  # fmt: skip
ANSWER_TYPES = {
    "source": "string", "position": "int64", "problem_key": "string", "solved": "bool",
    "samples": "int64", "samples_correct": "int64", "prompt": "string", "reference": "string",
    "answer": "string",
}  # fmt: skip


def _export_answers(
    run: int, fmt: ExportFormat, out: Path | None, url: str | None, token: str | None
) -> None:
    rows: list[dict[str, Any]] = []
    with _client(url, token) as lab:
        first = lab.run_answers(run, text=False)  # which evaluations it keeps, per source
        for source, steps in first["sources"].items():
            for step in steps:
                got = lab.run_answers(run, step=step, source=source)
                rows += [
                    {**{c: a.get(c) for c in ANSWER_COLUMNS}, "step": step, "source": source}
                    for a in got["answers"]
                ]
    target = out or Path(f"run-{run}-answers.{fmt.value}")
    if str(target) == "-" and fmt is ExportFormat.parquet:
        _fail("parquet cannot go to stdout; give --out FILE", code=2)
    _write_rows(rows, ANSWER_COLUMNS, fmt, target, ANSWER_TYPES)
    where = "stdout" if str(target) == "-" else str(target)
    err_console.print(f"wrote {len(rows)} answers to {where} (one row per evaluation, problem)")


# --------------------------------------------------------------------------------------------
# watch
# --------------------------------------------------------------------------------------------


def _follow(lab: Client, run_id: int, since_step: int | None = None) -> Run:
    """Render a run's stream until its ``end`` event; returns the final Run.

    On a terminal: a live progress bar and table. Piped (logs, CI): one line per step and per
    status change, flushed as it comes. Either way the clock is the run's own elapsed time
    (since it started), and an evaluation value says the step it was measured at.
    """
    run = lab.get_run(run_id)
    view = _WatchView(run)
    if not console.is_terminal:
        print(view.line(f"run {run.id} {run.name or ''}: {run.status_text},"), flush=True)
        for event in lab.watch(run_id, since_step=since_step):
            for line in view.apply(event):
                print(line, flush=True)
        return _final(lab, run_id)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[elapsed]}"),
        console=console,
    )
    task = progress.add_task(
        _describe(run), total=run.total_steps or None, completed=run.step, elapsed=view.elapsed()
    )

    def render() -> Group:
        table = Table(show_header=True, box=None, pad_edge=False)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key in KEY_METRICS:
            table.add_row(key, view.value_text(key))
        return Group(progress, table)

    with Live(render(), console=console, refresh_per_second=4) as live:
        for event in lab.watch(run_id, since_step=since_step):
            view.apply(event)
            progress.update(
                task,
                description=_describe(view.run),
                total=view.run.total_steps or None,
                completed=max(view.step, view.run.step),
                elapsed=view.elapsed(),
            )
            live.update(render())
    return _final(lab, run_id)


def _final(lab: Client, run_id: int) -> Run:
    run = lab.get_run(run_id)
    console.print(f"run {run.id}: {_status_text(run)}" + (f" ({run.error})" if run.error else ""))
    return run


class _WatchView:
    """What ``watch`` shows: the latest value of each key metric with the step it came from."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.step = run.step
        self.latest: dict[str, tuple[float | None, int | None]] = {
            k: (run.summary.get(k), None) for k in KEY_METRICS
        }

    def elapsed(self) -> str:
        if self.run.started_at is None:
            return "not started"
        end = self.run.finished_at or time.time()
        return _duration(end - self.run.started_at)

    def value_text(self, key: str) -> str:
        value, step = self.latest.get(key, (None, None))
        # Evaluation runs every eval.every steps: say which step a value is from.
        at = f" @{step}" if key.startswith("eval/") and step is not None else ""
        return _fmt(value) + at

    def apply(self, event: Any) -> list[str]:
        """Take one stream event; the lines a piped watch prints for it."""
        if event.event == "status" and event.run is not None:
            # A phase change is news too: minutes of evaluation log no step.
            changed = event.run.status_text != self.run.status_text
            self.run = event.run
            self.step = max(self.step, event.run.step)
            if not changed:
                return []
            again = f" ({self.run.attempts_text})" if self.run.attempts_text else ""
            return [f"[{self.elapsed()}] run {self.run.id}: {self.run.status_text}{again}"]
        if event.event != "metrics" or not isinstance(event.data, dict):
            return []
        fresh = False
        for key, s in (event.data.get("series") or {}).items():
            points = [
                (st, v)
                for st, v in zip(s.get("steps", []), s.get("values", []), strict=False)
                if v is not None
            ]
            if key in self.latest and points:
                self.latest[key] = (points[-1][1], points[-1][0])
                fresh = True
        step_max = event.data.get("step_max")
        if isinstance(step_max, int) and step_max > self.step:
            self.step, fresh = step_max, True
        # One line per step: a late write of an older step (an eval) updates quietly.
        fresh = fresh and (not isinstance(step_max, int) or step_max >= self.step)
        if not fresh:
            return []
        return [self.line()]

    def line(self, prefix: str = "") -> str:
        values = " ".join(f"{k}={self.value_text(k)}" for k in KEY_METRICS)
        total = self.run.total_steps or "?"
        return (
            f"[{self.elapsed()}] {prefix}{' ' if prefix else ''}step {self.step}/{total} {values}"
        )


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _describe(run: Run) -> str:
    return " ".join(p for p in (f"run {run.id}", run.name, "·", run.status_text) if p)


# --------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------


def better_direction(key: str) -> str:
    """The better direction of ``key``: "higher", "lower" or "" (no best: a descriptive key such
    as a score mean), from the catalogue; for keys logged from elsewhere (TRL's ``loss``,
    ``kl``), a guess from the name."""
    known = M.metric(key)
    if known is not None:
        return known.better
    base = key.rsplit("/", 1)[-1]
    return "lower" if base in {"loss", "kl", "grad_norm"} or base.endswith("_loss") else "higher"


def _mean_last(s: Series | None, k: int) -> float | None:
    values = [v for v in (s.values if s is not None else []) if v is not None]
    return sum(values[-k:]) / len(values[-k:]) if values else None


def _last_best(
    run: Run, key: str, s: Series | None
) -> tuple[float | None, float | None, int | None, int]:
    """Last value (the run summary's, exact even for a bucketed series) and the best bucket
    extreme (min/max arrays keep spikes through server-side sampling)."""
    last = run.summary.get(key)
    if s is None or not s.steps:
        return last, None, None, 0
    if last is None:
        last = next((v for v in reversed(s.values) if v is not None), None)
    direction = better_direction(key)
    if not direction:
        return last, None, None, s.total_points or len(s.steps)
    extremes = s.min if direction == "lower" else s.max
    if len(extremes) != len(s.steps):
        extremes = s.values
    candidates = [(v, step) for v, step in zip(extremes, s.steps, strict=False) if v is not None]
    if not candidates:
        return last, None, None, s.total_points
    pick = min if direction == "lower" else max
    best, best_step = pick(candidates, key=lambda c: c[0])
    return last, best, best_step, s.total_points or len(s.steps)


# --------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------


def _all_points(lab: Client, run_id: int, keys: Sequence[str]) -> dict[str, Series]:
    """Every raw point of ``keys`` (paged by step range, so nothing is bucketed)."""
    merged = {k: Series() for k in keys}
    for page in lab.iter_points(run_id, keys):
        for key, s in page.items():
            m = merged.setdefault(key, Series())
            m.steps += s.steps
            m.values += s.values
            same = len(s.wall_time) == len(s.steps)
            m.wall_time += s.wall_time if same else [None] * len(s.steps)
            m.total_points += len(s.steps)
    return merged


def _wide_rows(
    series: dict[str, Series], keys: Sequence[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    by_step: dict[int, dict[str, Any]] = {}
    for key in keys:
        s = series.get(key)
        if s is None:
            continue
        walls = s.wall_time if len(s.wall_time) == len(s.steps) else [None] * len(s.steps)
        for step, value, wall in zip(s.steps, s.values, walls, strict=False):
            row = by_step.setdefault(step, {"step": step, "wall_time": None})
            row[key] = value
            if wall is not None and (row["wall_time"] is None or wall > row["wall_time"]):
                row["wall_time"] = wall
    columns = ["step", "wall_time", *[k for k in keys if k in series]]
    rows = [{c: by_step[step].get(c) for c in columns} for step in sorted(by_step)]
    return rows, columns


def _long_rows(run_id: int, series: dict[str, Series]) -> tuple[list[dict[str, Any]], list[str]]:
    rows = []
    for key, s in series.items():
        walls = s.wall_time if len(s.wall_time) == len(s.steps) else [None] * len(s.steps)
        for step, value, wall in zip(s.steps, s.values, walls, strict=False):
            rows.append(
                {"run_id": run_id, "key": key, "step": step, "value": value, "wall_time": wall}
            )
    rows.sort(key=lambda r: (r["key"], r["step"]))
    return rows, ["run_id", "key", "step", "value", "wall_time"]


def _write_rows(
    rows: list[dict[str, Any]],
    columns: list[str],
    fmt: ExportFormat,
    target: Path,
    column_types: dict[str, str] | None = None,
) -> None:
    """``column_types``: a Parquet column's type by name (pyarrow's: "string", "bool", "int64");
    the rest are float64 but run_id, step (int64) and key (string)."""
    if fmt is ExportFormat.parquet:
        import pyarrow as pa
        import pyarrow.parquet as pq

        types = {"run_id": pa.int64(), "step": pa.int64(), "key": pa.string()}
        types |= {c: pa.type_for_alias(t) for c, t in (column_types or {}).items()}
        schema = pa.schema([(c, types.get(c, pa.float64())) for c in columns])
        table = pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(table, target)
        return
    buf = io.StringIO()
    if fmt is ExportFormat.csv:
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:  # missing and null values are empty cells
            writer.writerow({c: "" if row.get(c) is None else neutralised(row[c]) for c in columns})
    else:
        for row in rows:
            buf.write(json.dumps(row) + "\n")
    if str(target) == "-":
        sys.stdout.write(buf.getvalue())
    else:
        target.write_text(buf.getvalue())


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


@contextmanager
def _client(url: str | None, token: str | None) -> Iterator[Client]:
    """A client whose API errors become a message and an exit code (2 for a 4xx, else 1)."""
    lab = Client(url, token)
    try:
        yield lab
    except ServerUnavailable as exc:
        _fail(f"{exc.detail} (set --url or CONSPO_URL)", code=1)
    except ApiError as exc:
        _fail(str(exc), code=2 if 400 <= exc.status < 500 else 1)
    finally:
        lab.close()


def _fail(message: str, code: int) -> Any:
    err_console.print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML (or JSON) file that must hold a mapping; a clear message and exit 2 otherwise.
    ``what`` says what the mapping holds, e.g. "a study file is a mapping (name, config, …)"."""
    import yaml

    from conspo.config import load_yaml

    try:
        data = load_yaml(path.read_text())
    except FileNotFoundError:
        return _fail(f"{path}: no such file", code=2)
    except (yaml.YAMLError, OSError) as exc:
        return _fail(f"{path}: cannot read it: {exc}", code=2)
    if not isinstance(data, dict):
        return _fail(f"{path}: {what}", code=2)
    return data


def _format_validation(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {field}: {err['msg']}")
    return "\n".join(lines)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_ints(text: str, option: str) -> list[int]:
    try:
        return [int(part) for part in _split(text)]
    except ValueError:
        return _fail(f"{option} takes a comma list of integers, got {text!r}", code=2)


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e6:
        return f"{value:g}"
    return f"{value:.4g}"


_STATUS_STYLE = {
    "queued": "cyan",
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def _status_text(run: Run) -> str:
    """The status as the runs page shows it: a running run's phase, a queued run's place and
    why it waits, and a run's attempts, worker deaths and where it resumed, too."""
    text = run.status_text + (" (cancel requested)" if run.cancel_requested else "")
    if run.status == "queued" and run.queue_position:
        text += f" #{run.queue_position}"
    styled = f"[{_STATUS_STYLE.get(run.status, 'white')}]{escape(text)}[/]"
    for note in (run.attempts_text, run.waiting_reason):
        if note:
            styled += f"\n[dim]{escape(note)}[/]"
    return styled
