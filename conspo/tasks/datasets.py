"""Math datasets from local files, read with the `datasets` library: problems and their answers.

    problems = load_problems(DataFiles(), "data/train.parquet", DatasetFields())   # [Example]

A dataset is a file (parquet, jsonl, json, arrow) or a directory (a ``save_to_disk`` Dataset or
DatasetDict, or parquet shards), found and size-checked through ``conspo.access.DataFiles`` (data
roots, no escape by ``..`` or symlinks, the size cap on the file or the directory's total).

Which columns hold the question and the answer is ``DatasetFields``: named columns, dotted paths
into nested records (DAPO-Math-17k's ``reward_model.ground_truth``), or "auto", which tries the
usual names. A question given as a list of chat messages is its last user message; an answer is
reduced to what the verifier compares (GSM8K's "...#### 42" → "42", a solution's last \\boxed{}).

Nothing here touches the network or the user's cache: the builders run with a temporary cache
directory, deleted after loading, and the data is kept in memory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conspo.access import DataFiles
from conspo.config import DatasetFields
from conspo.tasks.answers import reference_answer
from conspo.tasks.base import Example

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict  # type: ignore[import-untyped]

QUESTION_COLUMNS = ("problem", "question", "prompt", "query")
ANSWER_COLUMNS = ("answer", "final_answer", "reward_model.ground_truth")
SOLUTION_COLUMNS = ("solution",)
_FILE_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}


def load_problems(
    files: DataFiles, name: str, fields: DatasetFields, split: str | tuple[str, ...] = "train"
) -> list[Example]:
    """The (question, reference answer) of every row of the dataset ``name``.

    ``split``: the split of a DatasetDict directory, or splits in order of preference (ignored
    for a single dataset).
    """
    dataset = load_dataset_file(files, name, split)
    columns = dataset.column_names
    rows = dataset.to_list()
    question = _question_path(name, fields, columns, rows)
    answer, from_solution = _answer_path(name, fields, columns, rows)
    problems = []
    for i, row in enumerate(rows):
        q = _question_text(_get(row, question, name, i))
        a = _get(row, answer, name, i)
        if a is None:
            raise ValueError(f"{name}: row {i}: {answer!r} is empty")
        if from_solution and "\\boxed{" not in str(a):
            raise ValueError(f"{name}: row {i}: the solution column {answer!r} has no \\boxed{{}}")
        problems.append(Example(q, reference_answer(str(a))))
    return problems


def load_dataset_file(
    files: DataFiles, name: str, split: str | tuple[str, ...] = "train"
) -> Dataset:
    """The dataset at ``name`` (checked through ``files``), in memory."""
    real = files.check_path(name)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read before datasets' first import
    from datasets import Dataset, DatasetDict, load_from_disk

    with tempfile.TemporaryDirectory(prefix="conspo-datasets-") as cache:
        if (problem := layout_problem(name, real)) is not None:
            raise ValueError(problem)
        if real.is_file():
            return _load_file(name, real, cache)
        if _saved_to_disk(real):
            loaded = load_from_disk(str(real), keep_in_memory=True)
            if isinstance(loaded, DatasetDict):
                return _split(name, loaded, (split,) if isinstance(split, str) else split)
            return loaded
        shards = sorted(str(p) for p in real.rglob("*.parquet"))
        return Dataset.from_parquet(shards, cache_dir=cache, keep_in_memory=True)


def layout_problem(name: str, real: Path) -> str | None:
    """Why the file or directory ``real`` (``name`` as the config gave it, already checked by
    ``DataFiles``) cannot hold a dataset, judged by its names alone (nothing is read): a file
    of an unknown format, a directory neither ``save_to_disk``'d nor holding .parquet files."""
    if real.is_file():
        if real.suffix.lower() not in _FILE_FORMATS:
            return f"{name}: unknown format {real.suffix!r} (use {', '.join(_FILE_FORMATS)})"
        return None
    if _saved_to_disk(real) or next(real.rglob("*.parquet"), None) is not None:
        return None
    return f"{name}: a directory that is neither a save_to_disk dataset nor holds .parquet files"


def _saved_to_disk(real: Path) -> bool:
    return (real / "dataset_dict.json").is_file() or (real / "state.json").is_file()


def _split(name: str, splits: DatasetDict, wanted: tuple[str, ...]) -> Dataset:
    found = next((s for s in wanted if s in splits), None)
    if found is None:
        raise ValueError(
            f"{name}: no split {' or '.join(map(repr, wanted))} (splits: {', '.join(splits)});"
            " set split"
        )
    return splits[found]


def _load_file(name: str, real: Path, cache: str) -> Dataset:
    from datasets import Dataset

    kind = _FILE_FORMATS[real.suffix.lower()]  # layout_problem refused any other
    try:
        if kind == "arrow":
            return Dataset.from_file(str(real), in_memory=True)
        reader = Dataset.from_parquet if kind == "parquet" else Dataset.from_json
        return reader(str(real), cache_dir=cache, keep_in_memory=True)
    except Exception as exc:  # pyarrow's and datasets' many parse errors
        raise ValueError(
            f"{name}: not a readable {kind} file ({type(exc).__name__}: {exc})"
        ) from None


# --------------------------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------------------------


def _has(columns: list[str], rows: list[dict[str, Any]], path: str) -> bool:
    """Whether the column ``path`` (dotted: into nested records) exists, judged by row 0."""
    head, *rest = path.split(".")
    if head not in columns:
        return False
    value: Any = rows[0][head] if rows else None
    for key in rest:
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return True


def _named(name: str, field: str, path: str, columns: list[str], rows: list[dict[str, Any]]) -> str:
    if not _has(columns, rows, path):
        raise ValueError(f"{name}: no column {path!r} (columns: {', '.join(columns)}); fix {field}")
    return path


def _first(columns: list[str], rows: list[dict[str, Any]], paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if _has(columns, rows, p)), None)


def _question_path(
    name: str, fields: DatasetFields, columns: list[str], rows: list[dict[str, Any]]
) -> str:
    if fields.question != "auto":
        return _named(name, "fields.question", fields.question, columns, rows)
    found = _first(columns, rows, QUESTION_COLUMNS)
    if found is None:
        raise ValueError(
            f"{name}: no question column (tried {', '.join(QUESTION_COLUMNS)}; columns:"
            f" {', '.join(columns)}); set fields.question"
        )
    return found


def _answer_path(
    name: str, fields: DatasetFields, columns: list[str], rows: list[dict[str, Any]]
) -> tuple[str, bool]:
    """(the answer's column, whether it is a worked solution whose \\boxed{} is the answer)."""
    if fields.answer != "auto":
        return _named(name, "fields.answer", fields.answer, columns, rows), False
    found = _first(columns, rows, ANSWER_COLUMNS)
    if found is not None:
        return found, False
    if fields.solution is not None:
        return _named(name, "fields.solution", fields.solution, columns, rows), True
    solution = _first(columns, rows, SOLUTION_COLUMNS)
    if solution is None:
        raise ValueError(
            f"{name}: no answer column (tried {', '.join(ANSWER_COLUMNS + SOLUTION_COLUMNS)};"
            f" columns: {', '.join(columns)}); set fields.answer"
        )
    return solution, True


def _get(row: dict[str, Any], path: str, name: str, index: int) -> Any:
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"{name}: row {index}: no {path!r}")
        value = value[key]
    return value


def _question_text(value: Any) -> str:
    """A question as text: a list of chat messages gives its last user message's content."""
    if isinstance(value, list):
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return str(users[-1].get("content", ""))
    return str(value)
