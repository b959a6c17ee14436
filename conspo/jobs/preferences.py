"""What the kinds that train on preference pairs share (``dpo``, ``reward_model``): their source
parameters, the pairs and where they come from.

    kind_params: {path: data/prefs.jsonl}        # columns prompt (a question), chosen, rejected
    kind_params: {from_run: 12}                  # pairs built from run 12's sampled rollouts

A pairs file's prompt is a question, rendered like every prompt (the run's template and chat
frame); every row must hold the three columns as non-empty text, and a row that does not is
refused by its number. Pairs from a finished run (``from_run``): whoever launches the job writes
them to ``workdir/dpo_pairs.jsonl`` first (the worker does, from the run's stored rollouts:
``pairs_from_run``). Only a sample of each step's rollouts is stored
(``logging.rollout_sample``, spread evenly over the batch), so a prompt pairs only when its
stored rollouts hold both a verified-correct and a wrong completion; prompts are the rendered
text the policy saw, matched exactly across steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from conspo.jobs.base import DatasetParams

if TYPE_CHECKING:
    from conspo.access import DataFiles
    from conspo.config import RunConfig

# In the job's workdir, for kind_params.from_run. Named when DPO alone read pairs; kept, so a
# DPO run's workdir holds what it always did.
PAIRS_FILE = "dpo_pairs.jsonl"
COLUMNS = ("prompt", "chosen", "rejected")


class PreferenceParams(DatasetParams):
    """Base of the parameters of a kind that trains on (prompt, chosen, rejected) pairs."""

    # path: the pairs, columns prompt (a question, rendered like every prompt), chosen, rejected
    from_run: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Build the pairs from this finished run's stored rollouts instead: a"
        " verified-correct vs a wrong completion of the same prompt.",
    )
    max_pairs_per_prompt: int = Field(
        4, ge=1, le=1000, description="from_run: pairs kept per prompt (each completion once)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> PreferenceParams:
        if (self.path is None) == (self.from_run is None):
            raise ValueError("give exactly one of path (a pairs dataset) and from_run (a run id)")
        return self


@dataclass(frozen=True)
class Pair:
    prompt: str  # as the policy sees it (rendered)
    chosen: str
    rejected: str


def build_pairs(
    rollouts: Iterable[tuple[str, str, bool]], max_per_prompt: int
) -> tuple[list[Pair], dict[str, int]]:
    """Pairs from (prompt, completion, verified correct) rollouts, and counts for the report.

    Per prompt, in the order given: the i-th distinct correct completion is paired with the i-th
    distinct wrong one, up to ``max_per_prompt`` (each completion in one pair at most).
    """
    by_prompt: dict[str, tuple[list[str], list[str]]] = {}
    n = 0
    for prompt, completion, correct in rollouts:
        n += 1
        good, bad = by_prompt.setdefault(prompt, ([], []))
        side = good if correct else bad
        if completion not in side:
            side.append(completion)
    pairs = [
        Pair(prompt, c, r)
        for prompt, (good, bad) in by_prompt.items()
        for c, r in list(zip(good, bad, strict=False))[:max_per_prompt]
    ]
    paired = len({p.prompt for p in pairs})
    return pairs, {"rollouts": n, "prompts": len(by_prompt), "paired_prompts": paired}


def write_pairs(pairs: list[Pair], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(p)) + "\n" for p in pairs))
    tmp.replace(path)


def pairs_from_run(
    config: RunConfig,
    workdir: Path,
    rollouts_of: Callable[[int], Iterable[tuple[str, str, float | None]]],
) -> None:
    """The job's inputs (``RegisteredJobKind.inputs``): with ``from_run``, the pairs built from
    that run's stored rollouts, written to ``workdir/dpo_pairs.jsonl`` once (a resumed attempt
    reuses them). A rollout is correct when its reward passes the one positive threshold."""
    from conspo.objectives.base import is_positive

    params = config.job_params()
    assert isinstance(params, PreferenceParams)
    path = workdir / PAIRS_FILE
    if params.from_run is None or path.is_file():
        return
    rollouts = ((p, c, is_positive(r)) for p, c, r in rollouts_of(params.from_run))
    pairs, _ = build_pairs(rollouts, params.max_pairs_per_prompt)
    write_pairs(pairs, path)


def load_pairs(
    params: PreferenceParams, files: DataFiles, workdir: Path, render: Callable[[str], str]
) -> list[Pair]:
    """The pairs the kind trains on: ``params.path``'s rows (each prompt through ``render``) or
    the ones ``pairs_from_run`` prepared; a file missing a column, holding no rows or a row whose
    column is not non-empty text is refused, by its name, the column and the row's number."""
    if params.from_run is not None:
        path = workdir / PAIRS_FILE
        if not path.is_file():
            raise ValueError(
                f"kind_params.from_run: the pairs of run {params.from_run} were not prepared"
                f" ({path} is missing)"
            )
        pairs = [Pair(**json.loads(line)) for line in path.read_text().splitlines() if line]
        where = f"run {params.from_run}'s stored rollouts"
    else:
        assert params.path is not None
        pairs = [
            Pair(render(r.prompt), r.chosen, r.rejected)
            for r in read_pairs_file(files, params.path)
        ]
        where = params.path
    if not pairs:
        raise ValueError(
            f"no preference pairs in {where}: it needs prompts with both a correct and a wrong"
            " completion"
        )
    return pairs


def read_pairs_file(files: DataFiles, name: str) -> list[Pair]:
    """The rows of the pairs dataset ``name`` (prompts as written), checked."""
    from conspo.tasks.datasets import load_dataset_file

    try:
        rows: list[dict[str, Any]] = load_dataset_file(files, name).to_list()
    except ValueError as exc:  # unreadable, an empty file, an unknown format
        raise ValueError(f"kind_params.path: {exc}") from None
    if not rows:
        raise ValueError(f"kind_params.path: {name} holds no rows (columns {', '.join(COLUMNS)})")
    missing = [c for c in COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"kind_params.path: {name} lacks columns {missing}")
    for number, row in enumerate(rows, 1):
        for column in COLUMNS:
            value = row[column]
            if not isinstance(value, str) or not value:
                raise ValueError(
                    f"kind_params.path: {name} row {number}: {column} must be non-empty text"
                    f" (got {value!r:.60})"
                )
    return [Pair(row["prompt"], row["chosen"], row["rejected"]) for row in rows]
