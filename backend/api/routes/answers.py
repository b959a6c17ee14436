"""Answers, problem by problem: what each run answered to the same held-out (or benchmark)
problem at an evaluation, who was right, and a problem's history across a run's evaluations
(``backend.storage.answers``).

``GET /api/answers?runs=…`` pairs runs' problems by prompt: runs of one task, template and
seed (a study's arms at one seed) answer the same problems. Two runs' paired outcomes get
McNemar's exact test: of the problems one solved and the other did not, is either side more
often the solver than chance would make it?"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from backend.api.contract import refusals
from backend.api.deps import RunDep, SessionDep, StudyDep, found_runs
from backend.api.query import parse_ids, run_id_list
from backend.errors import InvalidInput
from backend.models import Run
from backend.storage import answers as stored
from backend.storage.studies import study_rows
from conspo.input_checks import LABEL
from conspo.sink import HELD_OUT

router = APIRouter(tags=["answers"])

MAX_RUNS = 50
MAX_PAGE = 500
MAX_PAIRED_RUNS = 10  # pairs (and McNemar lines) only up to this many runs: 45 pairs
Source = Annotated[
    str,
    LABEL,  # no control characters (NUL included): the schema says so, and the database agrees
    Query(
        min_length=1,
        max_length=100,
        description="held_out (the held-out split), or a benchmark's name (eval.benchmarks).",
    ),
]
StepChoice = Annotated[
    str,
    Query(
        max_length=12,
        pattern=r"^(last|first|[0-9]{1,10})$",
        description="last or first (each run's own), or a step every run evaluated.",
    ),
]
Show = Literal["all", "disagree", "regressed", "all_wrong", "all_right", "only"]


def mcnemar_p(a_only: int, b_only: int) -> float:
    """McNemar's exact two-sided p: the discordant problems' split against Binomial(n, ½)."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(a_only, b_only) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _step_of(run: Run, steps: list[int] | None, choice: str, source: str) -> int:
    if not steps:
        raise InvalidInput.at(
            ("query", "runs"),
            f"run {run.id} has no stored {source} answers (evaluations keep them since this"
            " platform stored them: a run logged before, or one that never evaluated, has none)",
        )
    if choice == "last":
        return steps[-1]
    if choice == "first":
        return steps[0]
    step = int(choice)
    if step not in steps:
        shown = ", ".join(map(str, steps[:30]))
        raise InvalidInput.at(
            ("query", "step"),
            f"run {run.id} has no {source} evaluation at step {step} (it has: {shown})",
        )
    return step


@router.get("/runs/{run_id}/answers")
def run_answers(
    run: RunDep,
    session: SessionDep,
    source: Source = HELD_OUT,
    step: StepChoice = "last",
    text: Annotated[bool, Query(description="With the prompt, reference and answer texts.")] = True,
) -> dict[str, Any]:
    """One run's problems at one evaluation, and which evaluations it keeps (at most
    ``MAX_EVALUATIONS`` per source, thinned evenly: the first and the latest always)."""
    sources = stored.evaluations(session, [run.id]).get(run.id, {})
    chosen = _step_of(run, sources.get(source), step, source)
    rows = stored.answers_at(session, run.id, source, chosen, text=text)
    return {
        "run_id": run.id,
        "source": source,
        "step": chosen,
        "sources": sources,
        "kept_evaluations": stored.MAX_EVALUATIONS,
        "answers": rows,
    }


@router.get("/runs/{run_id}/answers/history")
def problem_history(
    run: RunDep,
    session: SessionDep,
    problem: Annotated[str, Query(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")],
    source: Source = HELD_OUT,
) -> dict[str, Any]:
    """One problem (its ``problem_key``) across the run's kept evaluations."""
    return {
        "run_id": run.id,
        "source": source,
        "problem": problem,
        "steps": stored.history(session, run.id, source, problem),
    }


@router.get(
    "/answers", responses=refusals({404: "A run of `runs` does not exist (each one named)."})
)
def compare_answers(
    session: SessionDep,
    runs: Annotated[str, run_id_list(MAX_RUNS)],
    source: Source = HELD_OUT,
    step: StepChoice = "last",
    show: Annotated[
        Show,
        Query(
            description="all; disagree (solved by some runs, not all); regressed (solved at a"
            " run's first evaluation, not at this one); all_wrong; all_right; only (solved by"
            " run `a` and not by run `b`)."
        ),
    ] = "all",
    a: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    b: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    text: Annotated[bool, Query(description="With each answer's text.")] = False,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**6)] = 0,
) -> dict[str, Any]:
    """The runs' problems at one evaluation each, paired by problem, filtered by ``show``, a
    page at a time; each run's count solved; and, per pair of runs (up to
    ``MAX_PAIRED_RUNS`` runs), the problems each solved alone and McNemar's exact p."""
    ids = parse_ids(runs, "runs", MAX_RUNS)
    found = found_runs(session, ids)
    if show == "only" and (a not in ids or b not in ids or a == b):
        raise InvalidInput.at(("query", "a"), "show=only needs a and b: two of the runs given")
    held = stored.evaluations(session, ids)
    chosen = {r.id: _step_of(r, held.get(r.id, {}).get(source), step, source) for r in found}
    return _compared(session, found, chosen, source, held, show, a, b, text, limit, offset)


def _compared(
    session: Session,
    found: list[Run],
    chosen: dict[int, int],
    source: str,
    held: dict[int, dict[str, list[int]]],
    show: str,
    a: int | None,
    b: int | None,
    text: bool,
    limit: int,
    offset: int,
) -> dict[str, Any]:
    ids = [r.id for r in found]
    outcome: dict[int, dict[str, dict[str, Any]]] = {}
    problems: dict[str, dict[str, Any]] = {}  # by key, in the first run's order
    where_from: dict[str, int] = {}  # the first run that holds each problem: its prompt's source
    for run in found:
        outcome[run.id] = stored.outcomes(session, run.id, source, chosen[run.id])
        for key, row in outcome[run.id].items():
            if key not in problems:
                problems[key] = {"key": key, "position": row["position"]}
                where_from[key] = run.id
    first_solved: dict[int, set[str]] = {}
    if show == "regressed":
        for run in found:
            first = held[run.id][source][0]
            at_first = stored.outcomes(session, run.id, source, first)
            first_solved[run.id] = {k for k, r in at_first.items() if r["solved"]}

    def keep(key: str) -> bool:
        solved = [outcome[i][key]["solved"] for i in ids if key in outcome[i]]
        if show == "disagree":
            return any(solved) and not all(solved)
        if show == "all_wrong":
            return not any(solved)
        if show == "all_right":
            return bool(solved) and all(solved)
        if show == "only":
            assert a is not None and b is not None
            return bool(outcome[a].get(key, {}).get("solved")) and not outcome[b].get(key, {}).get(
                "solved", True
            )
        if show == "regressed":
            return any(
                key in first_solved[i] and key in outcome[i] and not outcome[i][key]["solved"]
                for i in ids
            )
        return True

    kept = [p for p in problems.values() if keep(p["key"])]
    page = kept[offset : offset + limit]
    prompt_of: dict[str, str] = {}
    for rid in dict.fromkeys(where_from[p["key"]] for p in page):
        keys = [p["key"] for p in page if where_from[p["key"]] == rid]
        found_texts = stored.texts(session, rid, source, chosen[rid], keys)
        prompt_of |= {key: t["prompt"] for key, t in found_texts.items()}
    texts = _texts(session, found, chosen, source, [p["key"] for p in page]) if text else {}
    out_problems = []
    for p in page:
        answers = {}
        for i in ids:
            if p["key"] not in outcome[i]:
                continue
            row = outcome[i][p["key"]]
            answer = {
                k: row[k] for k in ("solved", "score", "samples", "samples_correct", "position")
            }
            if text:
                answer |= texts.get((i, p["key"]), {})
            answers[str(i)] = answer
        out_problems.append({**p, "prompt": prompt_of.get(p["key"], ""), "answers": answers})
    return {
        "source": source,
        "sources": sorted({name for r in found for name in held[r.id]}),
        "runs": [
            {
                "id": r.id,
                "name": r.name,
                "step": chosen[r.id],
                "problems": len(outcome[r.id]),
                "solved": sum(1 for row in outcome[r.id].values() if row["solved"]),
                "evaluations": held[r.id].get(source, []),
            }
            for r in found
        ],
        "total": len(kept),
        "problems_seen": len(problems),
        "offset": offset,
        "limit": limit,
        "problems": out_problems,
        "pairs": _pairs(ids, outcome) if len(ids) <= MAX_PAIRED_RUNS else [],
    }


def _pairs(ids: list[int], outcome: dict[int, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            shared = outcome[a].keys() & outcome[b].keys()
            a_only = sum(
                1 for k in shared if outcome[a][k]["solved"] and not outcome[b][k]["solved"]
            )
            b_only = sum(
                1 for k in shared if outcome[b][k]["solved"] and not outcome[a][k]["solved"]
            )
            both = sum(1 for k in shared if outcome[a][k]["solved"] and outcome[b][k]["solved"])
            out.append(
                {
                    "a": a, "b": b, "shared": len(shared), "a_only": a_only, "b_only": b_only,
                    "both": both, "neither": len(shared) - a_only - b_only - both,
                    "mcnemar_p": mcnemar_p(a_only, b_only),
                }
            )  # fmt: skip
    return out


def _texts(
    session: Session, found: list[Run], chosen: dict[int, int], source: str, keys: list[str]
) -> dict[tuple[int, str], dict[str, Any]]:
    """Each run's reference, answer and episode of the page's problems, by (run, key)."""
    fields = ("reference", "answer", "episode")
    return {
        (run.id, key): t
        for run in found
        for key, t in stored.texts(session, run.id, source, chosen[run.id], keys, fields).items()
    }


@router.get("/studies/{study_id}/answers")
def study_answers(
    study: StudyDep, session: SessionDep, source: Source = HELD_OUT, step: StepChoice = "last"
) -> dict[str, Any]:
    """Each arm against the baseline (else the first arm), problem by problem, pooled over the
    seeds where both have stored answers: the problems each solved alone, McNemar's exact p on
    those (pairs are (seed, problem)), and per seed the two runs (for the answers view)."""
    by_arm_seed = {(row.arm, row.seed): row.run_id for row in study_rows(session, study.id)}
    arms = list(dict.fromkeys(arm for arm, _ in by_arm_seed))
    if not arms:
        return {"study_id": study.id, "source": source, "baseline": None, "arms": []}
    baseline = study.baseline if study.baseline in arms else arms[0]
    run_ids = [rid for rid in by_arm_seed.values() if rid is not None]
    held = stored.evaluations(session, run_ids)
    runs = {r.id: r for r in found_runs(session, run_ids)} if run_ids else {}
    solved_at: dict[int, dict[str, bool]] = {}
    for rid in run_ids:
        steps = held.get(rid, {}).get(source)
        if not steps:
            continue
        pick = steps[-1] if step == "last" else steps[0] if step == "first" else int(step)
        if pick not in steps:
            continue
        solved_at[rid] = {
            k: bool(r["solved"]) for k, r in stored.outcomes(session, rid, source, pick).items()
        }
    out_arms = []
    for arm in arms:
        if arm == baseline:
            continue
        a_only = b_only = shared = 0
        seeds = []
        for (arm_, seed), member in by_arm_seed.items():
            if arm_ != arm or member is None:
                continue
            rid = member
            base = by_arm_seed.get((baseline, seed))
            if base is None or rid not in solved_at or base not in solved_at:
                continue
            mine, theirs = solved_at[rid], solved_at[base]
            keys = mine.keys() & theirs.keys()
            alone = sum(1 for k in keys if mine[k] and not theirs[k])
            lost = sum(1 for k in keys if theirs[k] and not mine[k])
            a_only, b_only, shared = a_only + alone, b_only + lost, shared + len(keys)
            seeds.append(
                {"seed": seed, "run": rid, "baseline_run": base, "solved_alone": alone,
                 "baseline_alone": lost, "shared": len(keys),
                 "run_name": runs[rid].name, "baseline_name": runs[base].name}
            )  # fmt: skip
        out_arms.append(
            {
                "arm": arm, "shared": shared, "solved_alone": a_only, "baseline_alone": b_only,
                "mcnemar_p": mcnemar_p(a_only, b_only), "seeds": seeds,
            }
        )  # fmt: skip
    return {"study_id": study.id, "source": source, "baseline": baseline, "arms": out_arms}
