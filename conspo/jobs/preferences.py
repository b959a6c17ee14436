"""What the kinds that train on preferences share (``dpo``, ``reward_model`` on pairs; ``kto`` on
completions labelled desirable or not): their source parameters, the examples and where they come
from.

    kind_params: {path: data/prefs.jsonl}        # columns prompt (a question), chosen, rejected
    kind_params: {path: data/labels.jsonl}       # kto: columns prompt, completion, label (bool)
    kind_params: {from_run: 12}                  # built from run 12's sampled rollouts

A pairs file's prompt is a question, rendered like every prompt (the run's template and chat
frame); every row must hold the three columns as non-empty text, and a row that does not is
refused by its number. Pairs from a finished run (``from_run``): whoever launches the job writes
them to ``workdir/dpo_pairs.jsonl`` first (the worker does, from the run's stored rollouts:
``pairs_from_run``). Only a sample of each step's rollouts is stored
(``logging.rollout_sample``, spread evenly over the batch), so a prompt pairs only when its
stored rollouts hold both a verified-correct and a wrong completion; prompts are the rendered
text the policy saw, matched exactly across steps.

Labelled examples (``kto``) come from the same two sources and from a pairs file: a labels file's
rows are (prompt, completion, label), a pairs file's each give a desirable (chosen) and an
undesirable (rejected) example, and a run's stored rollouts each one labelled by its verified
outcome (``labelled_from_run`` writes them to ``workdir/kto_examples.jsonl``), deduplicated and
capped per prompt and side. The two sides need not balance, but neither may be empty.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

from conspo.jobs.base import DatasetParams

if TYPE_CHECKING:
    from conspo.access import DataFiles
    from conspo.config import RunConfig

# In the job's workdir, for kind_params.from_run. Named when DPO alone read pairs; kept, so a
# DPO run's workdir holds what it always did.
PAIRS_FILE = "dpo_pairs.jsonl"
COLUMNS = ("prompt", "chosen", "rejected")


class FileOrRunParams(DatasetParams):
    """Base of the parameters of a kind that trains on a dataset (``path``) or on what a finished
    run's stored rollouts give (``from_run``): exactly one of the two. A subclass words
    ``from_run``'s description and names its dataset (``dataset_noun``) for its own examples."""

    dataset_noun: ClassVar[str] = "a pairs dataset"

    from_run: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Build the pairs from this finished run's stored rollouts instead: a"
        " verified-correct vs a wrong completion of the same prompt.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> FileOrRunParams:
        if (self.path is None) == (self.from_run is None):
            raise ValueError(
                f"give exactly one of path ({self.dataset_noun}) and from_run (a run id)"
            )
        return self


class PreferenceParams(FileOrRunParams):
    """Base of the parameters of a kind that trains on (prompt, chosen, rejected) pairs."""

    # path: the pairs, columns prompt (a question, rendered like every prompt), chosen, rejected
    max_pairs_per_prompt: int = Field(
        4, ge=1, le=1000, description="from_run: pairs kept per prompt (each completion once)."
    )


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


def write_rows(rows: Iterable[Pair] | Iterable[Labelled], path: Path) -> None:
    """Pairs or labelled examples as JSONL at ``path``, atomically (a temporary file renamed)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(row)) + "\n" for row in rows))
    tmp.replace(path)


def verified_rollouts_to_write(
    config: RunConfig,
    workdir: Path,
    rollouts_of: Callable[[int], Iterable[tuple[str, str, float | None]]],
    name: str,
) -> tuple[FileOrRunParams, Iterable[tuple[str, str, bool]], Path] | None:
    """What a kind's ``from_run`` inputs hook writes: (its params, that run's stored rollouts as
    (prompt, completion, correct), ``workdir/name``), or None when there is no ``from_run`` or
    the file is already there (a resumed attempt reuses it). A rollout is correct when its
    reward passes the one positive threshold."""
    from conspo.objectives.base import is_positive

    params = config.job_params()
    assert isinstance(params, FileOrRunParams)
    path = workdir / name
    if params.from_run is None or path.is_file():
        return None
    rollouts = ((p, c, is_positive(r)) for p, c, r in rollouts_of(params.from_run))
    return params, rollouts, path


def pairs_from_run(
    config: RunConfig,
    workdir: Path,
    rollouts_of: Callable[[int], Iterable[tuple[str, str, float | None]]],
) -> None:
    """The job's inputs (``RegisteredJobKind.inputs``): with ``from_run``, the pairs built from
    that run's stored rollouts, written to ``workdir/dpo_pairs.jsonl`` once."""
    todo = verified_rollouts_to_write(config, workdir, rollouts_of, PAIRS_FILE)
    if todo is not None:
        params, rollouts, path = todo
        assert isinstance(params, PreferenceParams)
        write_rows(build_pairs(rollouts, params.max_pairs_per_prompt)[0], path)


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
    rows = checked_rows(dataset_rows(files, name, COLUMNS), name, COLUMNS)
    return [Pair(row["prompt"], row["chosen"], row["rejected"]) for row in rows]


def dataset_rows(files: DataFiles, name: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of the dataset ``name``, refused (``kind_params.path``, the file's name) when it
    is unreadable or holds no rows (the message names the ``columns`` it should hold)."""
    from conspo.tasks.datasets import load_dataset_file

    try:
        rows: list[dict[str, Any]] = load_dataset_file(files, name).to_list()
    except ValueError as exc:  # unreadable, an empty file, an unknown format
        raise ValueError(f"kind_params.path: {exc}") from None
    if not rows:
        raise ValueError(f"kind_params.path: {name} holds no rows (columns {', '.join(columns)})")
    return rows


def checked_rows(
    rows: list[dict[str, Any]],
    name: str,
    columns: tuple[str, ...],
    text: tuple[str, ...] | None = None,
    hint: str = "",
) -> list[dict[str, Any]]:
    """``rows``, refused when they lack one of ``columns`` (with ``hint`` after the message) or
    a row's ``text`` columns (all of ``columns`` by default) are not non-empty text (by the
    row's number and the column)."""
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise ValueError(f"kind_params.path: {name} lacks columns {missing}{hint}")
    for number, row in enumerate(rows, 1):
        for column in columns if text is None else text:
            value = row[column]
            if not isinstance(value, str) or not value:
                raise ValueError(
                    f"kind_params.path: {name} row {number}: {column} must be non-empty text"
                    f" (got {value!r:.60})"
                )
    return rows


# --------------------------------------------------------------------------------------------
# Labelled completions (kto): desirable or undesirable, one completion per example
# --------------------------------------------------------------------------------------------

# In the job's workdir, for kind_params.from_run of a kind on labelled examples.
EXAMPLES_FILE = "kto_examples.jsonl"
LABELLED_COLUMNS = ("prompt", "completion", "label")


@dataclass(frozen=True)
class Labelled:
    prompt: str  # as the policy sees it (rendered)
    completion: str
    desirable: bool


class LabelledParams(FileOrRunParams):
    """Base of the parameters of a kind that trains on completions labelled desirable or not."""

    dataset_noun: ClassVar[str] = "a labelled or pairs dataset"

    # path: columns prompt, completion, label (bool); or a pairs file (prompt, chosen, rejected)
    from_run: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Build the examples from this finished run's stored rollouts instead: its"
        " verified-correct completions desirable, its wrong ones undesirable.",
    )
    max_per_prompt: int = Field(
        4,
        ge=1,
        le=1000,
        description="from_run: distinct completions kept per prompt on each side (desirable,"
        " undesirable), the first ones stored.",
    )


def build_labelled(
    rollouts: Iterable[tuple[str, str, bool]], max_per_prompt: int
) -> tuple[list[Labelled], dict[str, int]]:
    """Labelled examples from (prompt, completion, verified correct) rollouts, and counts.

    Per prompt and side, in the order given: the distinct completions, the first
    ``max_per_prompt`` of them (a completion stored twice, at two steps, counts once). A prompt
    with one side only still gives its examples: KTO needs no pair."""
    by_prompt: dict[str, tuple[list[str], list[str]]] = {}
    n = 0
    for prompt, completion, correct in rollouts:
        n += 1
        good, bad = by_prompt.setdefault(prompt, ([], []))
        side = good if correct else bad
        if completion not in side and len(side) < max_per_prompt:
            side.append(completion)
    examples = [
        Labelled(prompt, completion, desirable)
        for prompt, (good, bad) in by_prompt.items()
        for desirable, side in ((True, good), (False, bad))
        for completion in side
    ]
    desirable = sum(e.desirable for e in examples)
    return examples, {
        "rollouts": n,
        "prompts": len(by_prompt),
        "desirable": desirable,
        "undesirable": len(examples) - desirable,
    }


def labelled_from_run(
    config: RunConfig,
    workdir: Path,
    rollouts_of: Callable[[int], Iterable[tuple[str, str, float | None]]],
) -> None:
    """The job's inputs (``RegisteredJobKind.inputs``): with ``from_run``, that run's stored
    rollouts labelled by their verified outcome (``build_labelled``), written to
    ``workdir/kto_examples.jsonl`` once."""
    todo = verified_rollouts_to_write(config, workdir, rollouts_of, EXAMPLES_FILE)
    if todo is not None:
        params, rollouts, path = todo
        assert isinstance(params, LabelledParams)
        write_rows(build_labelled(rollouts, params.max_per_prompt)[0], path)


def load_labelled(
    params: LabelledParams, files: DataFiles, workdir: Path, render: Callable[[str], str]
) -> list[Labelled]:
    """The labelled examples the kind trains on: ``params.path``'s rows (a labels file, or a
    pairs file whose each pair is a desirable and an undesirable example; each prompt through
    ``render``) or the ones ``labelled_from_run`` prepared. Refused, naming the source, when
    either side is empty: the loss compares each side with the reference point, and a run with
    one side alone only pushes every completion one way."""
    if params.from_run is not None:
        path = workdir / EXAMPLES_FILE
        if not path.is_file():
            raise ValueError(
                f"kind_params.from_run: the examples of run {params.from_run} were not prepared"
                f" ({path} is missing)"
            )
        lines = path.read_text().splitlines()
        examples = [Labelled(**json.loads(line)) for line in lines if line]
        where = f"kind_params.from_run: run {params.from_run}'s stored rollouts"
        sides = "verified-correct (desirable) and wrong (undesirable) completions"
    else:
        assert params.path is not None
        examples = [
            Labelled(render(e.prompt), e.completion, e.desirable)
            for e in read_labelled_file(files, params.path)
        ]
        where = f"kind_params.path: {params.path}"
        sides = "rows with label true (desirable) and rows with label false (undesirable)"
    desirable = sum(e.desirable for e in examples)
    if desirable == 0 or desirable == len(examples):
        missing = "desirable" if desirable == 0 else "undesirable"
        raise ValueError(
            f"{where} holds no {missing} example ({len(examples)} examples, all"
            f" {'undesirable' if desirable == 0 else 'desirable'}): KTO needs {sides}"
        )
    return examples


def read_labelled_file(files: DataFiles, name: str) -> list[Labelled]:
    """The examples of the dataset ``name`` (prompts as written), checked: a labels file
    (prompt, completion, label: a boolean, or an integer 0 / 1), or a pairs file
    (prompt, chosen, rejected, no label) whose each pair gives a desirable and an undesirable
    example; the first row's columns tell which."""
    rows = dataset_rows(files, name, LABELLED_COLUMNS)
    if {"chosen", "rejected"} <= rows[0].keys() and "label" not in rows[0]:
        pairs = checked_rows(rows, name, COLUMNS)
        return [
            Labelled(row["prompt"], row[side], side == "chosen")
            for row in pairs
            for side in ("chosen", "rejected")
        ]
    hint = " (a labels file: prompt, completion, label; or a pairs file: prompt, chosen, rejected)"
    checked_rows(rows, name, LABELLED_COLUMNS, text=("prompt", "completion"), hint=hint)
    for number, row in enumerate(rows, 1):
        label = row["label"]
        if not (isinstance(label, bool) or (isinstance(label, int) and label in (0, 1))):
            raise ValueError(
                f"kind_params.path: {name} row {number}: label must be true or false"
                f" (desirable or not; got {label!r:.60})"
            )
    return [Labelled(row["prompt"], row["completion"], bool(row["label"])) for row in rows]
