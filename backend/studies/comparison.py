"""A comparison of runs (the compare page's selection, grouped) as a study-like view, so the
study report renders it: the groups are the arms, each run's objective is its mean over the
last-N window of one metric, and each group is set against a baseline group.

Use::

    view = comparison_view(session, runs, group="algorithm", objective=Objective(metric=...))
    report.study_report(view)      # one self-contained HTML file
    comparison_csv(view)           # per-run values over the window

Groups are labelled as the compare page labels them (``algorithm=grpo``). Two groups are paired
by seed, as on the page, when each group's runs have distinct seeds and the two share at least
two of them; otherwise they are compared unpaired (Welch), and the verdict line says so.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from backend.models import Run
from backend.studies import stats
from backend.studies.service import (
    SEPARATION_KEYS,
    ArmRunRow,
    _jsonable,
    _series,
    bounds_of,
    group_curves,
    run_objective,
    window_start,
)
from backend.studies.spec import Objective
from conspo import metrics as M

# Run fields a group-by path names directly; anything else is a config path. The compare page
# gets this list from the server (pages.py), so its groups and the report's are the same.
RUN_FIELDS = ("algorithm", "task", "model", "status", "seed", "group_id", "owner")


def _text(value: Any) -> str:
    """A group value spelled as the page's fmtValue spells it (its labels and ours must match:
    the baseline is chosen by label)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def group_label(run: Run, path: str) -> str:
    if not path:
        return f"{run.name} #{run.id}"
    if path == "owner":
        value: Any = run.owner.name if run.owner is not None else None
    elif path in RUN_FIELDS:
        value = getattr(run, path)
    elif path == "tags":
        value = ",".join(run.tags or [])
    else:
        value = run.config or {}
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    return f"{path}={_text(value)}"


def _distinct_seeds(runs: Sequence[Run]) -> bool:
    return len({r.seed for r in runs}) == len(runs)


def comparison_view(
    session: Session,
    runs: Sequence[Run],
    *,
    group: str,
    objective: Objective,
    baseline: str | None = None,
) -> dict[str, Any]:
    """Everything the study renderer shows, for runs grouped by ``group`` (a run per group when
    empty)."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[group_label(run, group)].append(run)
    labels = list(groups)
    base = baseline if baseline in groups else labels[0]
    series = _series(session, [r.id for r in runs], [objective.metric, *SEPARATION_KEYS])
    by_arm: dict[str, dict[int, float]] = {}
    separation: dict[str, dict[str, dict[int, float]]] = {}
    run_rows: list[dict[str, Any]] = []
    rows: list[ArmRunRow] = []
    for label, members in groups.items():
        # keyed by seed where the seeds are distinct (pairable), else by position
        keyed = _distinct_seeds(members)
        by_arm[label], separation[label] = {}, defaultdict(dict)
        for i, run in enumerate(members):
            value, window = run_objective(series, run.id, objective)
            key = int(run.seed) if keyed else i
            steps = series[(run.id, objective.metric)][0]
            if value is not None:
                by_arm[label][key] = value
                for metric, mean in window.items():
                    separation[label][metric][key] = mean
            rows.append(ArmRunRow(label, run.id))
            run_rows.append(
                {
                    "arm": label,
                    "seed": run.seed,
                    "run_id": run.id,
                    "name": run.name,
                    "status": run.status,
                    "step": run.step,
                    "total_steps": run.total_steps,
                    "objective": value,
                    "window_start": window_start(steps, objective.reduce, objective.k)
                    if steps
                    else None,
                    "window_points": _window_points(steps, objective),
                }
            )
    scale, unit = objective.scale or 1.0, objective.unit or ""
    bounds = M.bounds(objective.metric)
    pairs, unpaired, verdict = [], [], []
    for label in labels:
        if label == base:
            continue
        common = set(by_arm[label]) & set(by_arm[base])
        if _distinct_seeds(groups[label]) and _distinct_seeds(groups[base]) and len(common) >= 2:
            pair = stats.paired(
                label, base, by_arm[label], by_arm[base], objective.direction, bounds
            )
            pairs.append(_jsonable(vars(pair)))
            verdict.append(
                stats.verdict_line(pair, scale=scale, unit=unit, effect=objective.effect)
            )
        else:
            loose = stats.unpaired(
                label, base, list(by_arm[label].values()), list(by_arm[base].values()), bounds
            )
            unpaired.append(_jsonable(vars(loose)))
            verdict.append(stats.unpaired_line(loose, scale=scale, unit=unit))
    arms = []
    for label in labels:
        arm = _jsonable(vars(stats.summarise_arm(label, by_arm[label], bounds)))
        arms.append({**arm, "planned": len(groups[label]), "overrides": None, "params": None})
    ids = [r.id for r in runs]
    return {
        "id": None,
        "kind": "comparison",
        "title": f"Comparison of {len(runs)} runs" + (f", grouped by {group}" if group else ""),
        "name": ", ".join(f"#{i}" for i in ids),
        "run_ids": ids,
        "group": group,
        "status": "comparison",
        "spec": {},
        "baseline": base,
        "objective": objective.model_dump(mode="json"),
        "arms": arms,
        "pairs": pairs,
        "unpaired": unpaired,
        "verdict": verdict,
        "pairing_note": "Groups are paired by seed where both ran the same seeds (two or more);"
        " otherwise compared unpaired (Welch).",
        "separation": {
            a: {k: _jsonable(vars(stats.summarise_arm(a, v, M.bounds(k)))) for k, v in sep.items()}
            for a, sep in separation.items()
        },
        "runs": run_rows,
        "counts": dict(Counter(str(r.status) for r in runs)),
        "seeds": sorted({int(r.seed) for r in runs}),
        # The metric compared, and only it: the page's choice, not the study's separation set.
        "curves": group_curves(session, rows, ids, [objective.metric]),
        "bounds": bounds_of([objective.metric]),
    }


def _window_points(steps: list[int], objective: Objective) -> int:
    if not steps:
        return 0
    if objective.reduce == "last":
        return 1
    if objective.reduce == "mean_last_k":
        return min(objective.k, len(steps))
    return len(steps)


def comparison_csv(view: dict[str, Any]) -> str:
    """Per run: its group, seed, status, the metric's window (first step, points) and value."""
    metric = view["objective"]["metric"]
    lines = ["group,run_id,name,seed,status,metric,reduce,window_start,window_points,value"]
    reduce = view["objective"]["reduce"]
    if reduce == "mean_last_k":
        reduce = f"mean_last_{view['objective']['k']}"
    for r in view["runs"]:
        value = r["objective"]
        cells = [
            r["arm"],
            r["run_id"],
            r["name"],
            r["seed"],
            r["status"],
            metric,
            reduce,
            "" if r["window_start"] is None else r["window_start"],
            r["window_points"],
            "" if value is None or not math.isfinite(value) else repr(float(value)),
        ]
        lines.append(",".join(_csv_cell(c) for c in cells))
    return "\n".join(lines) + "\n"


def _csv_cell(value: Any) -> str:
    text = str(value)
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text
