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

import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from backend.models import Run
from backend.runs.rows import arm_of
from backend.storage.series import WholeSeries as Series
from backend.storage.series import whole_series
from backend.studies import stats
from backend.studies.objective import (
    SEPARATION_KEYS,
    ArmObjectives,
    ArmRunRow,
    bounds_of,
    group_curves,
    jsonable,
    window_start,
)
from backend.studies.spec import Objective
from conspo import metrics as M
from conspo.spreadsheet import csv_cell

# Run fields a group-by path names directly; anything else is a config path. The compare page
# gets this list from the server (pages.py), so its groups and the report's are the same.
RUN_FIELDS = ("algorithm", "task", "model", "status", "seed", "group_id", "owner", "arm")


def _text(value: Any) -> str:
    """A group value spelled as the page's fmtValue spells it (its labels and ours must match:
    the baseline is chosen by label)."""
    if value is NOT_SET:
        return "(not set)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict) or (
        isinstance(value, list) and any(isinstance(v, dict | list) for v in value)
    ):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)  # JSON.stringify's
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
    elif path == "arm":
        value = arm_of(run.tags)
    elif path in RUN_FIELDS:
        value = getattr(run, path)
    elif path == "tags":
        value = ",".join(run.tags or [])
    else:
        value = run.config or {}
        for part in path.split("."):
            value = _child(value, part)
    return f"{path}={_text(value)}"


class _NotSet:
    """A path the run's config does not have (a GRPO run's params.contrast): its own label,
    "(not set)", on the page and in the report alike, not null's."""


NOT_SET = _NotSet()


def _child(value: Any, part: str) -> Any:
    """``value[part]`` as the page's getPath reads it: a key of an object, or an index of a list
    (the page offers flattened paths such as rewards.0.name to group by); ``NOT_SET`` when it
    has none."""
    if isinstance(value, dict):
        return value.get(part, NOT_SET)
    if isinstance(value, list) and part.isdigit() and int(part) < len(value):
        return value[int(part)]
    return NOT_SET


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
    series = whole_series(session, [r.id for r in runs], [objective.metric, *SEPARATION_KEYS])
    values = ArmObjectives.of(labels)
    run_rows = [
        row for label in labels for row in _run_rows(groups, label, series, objective, values)
    ]
    pairs, unpaired, verdict = _against_baseline(groups, base, values.by_arm, objective)
    arms = []
    for label in labels:
        arm = jsonable(
            vars(stats.summarise_arm(label, values.by_arm[label], M.bounds(objective.metric)))
        )
        arms.append({**arm, "planned": len(groups[label]), "overrides": None, "params": None})
    ids = [r.id for r in runs]
    rows = [ArmRunRow(label, run.id) for label in labels for run in groups[label]]
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
        "separation": values.separation_view(),
        "runs": run_rows,
        "counts": dict(Counter(str(r.status) for r in runs)),
        "seeds": sorted({int(r.seed) for r in runs}),
        # The metric compared, and only it: the page's choice, not the study's separation set.
        "curves": group_curves(session, rows, ids, [objective.metric]),
        "bounds": bounds_of([objective.metric]),
    }


def _run_rows(
    groups: dict[str, list[Run]],
    label: str,
    series: Series,
    objective: Objective,
    values: ArmObjectives,
) -> list[dict[str, Any]]:
    """The group's runs as the report lists them, each one's objective added to ``values``:
    keyed by seed where the group's seeds are distinct (pairable), else by position."""
    members = groups[label]
    keyed = _distinct_seeds(members)
    out = []
    for i, run in enumerate(members):
        value = values.add(series, label, int(run.seed) if keyed else i, run.id, objective)
        steps = series[(run.id, objective.metric)][0]
        out.append(
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
    return out


def _against_baseline(
    groups: dict[str, list[Run]],
    base: str,
    by_arm: dict[str, dict[stats.Key, float]],
    objective: Objective,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(paired comparisons, unpaired ones, verdict lines) of each group against ``base``:
    paired by seed when both groups' seeds are distinct and they share two or more."""
    scale, unit = objective.scale or 1.0, objective.unit or ""
    bounds = M.bounds(objective.metric)
    pairs, unpaired, verdict = [], [], []
    for label, values in by_arm.items():
        if label == base:
            continue
        common = set(values) & set(by_arm[base])
        if _distinct_seeds(groups[label]) and _distinct_seeds(groups[base]) and len(common) >= 2:
            pair = stats.paired(label, base, values, by_arm[base], objective.direction, bounds)
            pairs.append(jsonable(vars(pair)))
            verdict.append(
                stats.verdict_line(pair, scale=scale, unit=unit, effect=objective.effect)
            )
        else:
            loose = stats.unpaired(
                label, base, list(values.values()), list(by_arm[base].values()), bounds
            )
            unpaired.append(jsonable(vars(loose)))
            verdict.append(stats.unpaired_line(loose, scale=scale, unit=unit))
    return pairs, unpaired, verdict


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
            "" if value is None or not math.isfinite(value) else float(value),
        ]
        lines.append(",".join(csv_cell(c) for c in cells))
    return "\n".join(lines) + "\n"
