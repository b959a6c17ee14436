"""Your own problems: a JSON-lines file of {"prompt": ..., "answer": ...}, verified as math answers.

Answers are checked as in conspo.tasks.answers (a \\boxed{} answer or the last number).
"""

from __future__ import annotations

import json
from typing import ClassVar

from pydantic import Field

from conspo.access import DataFiles
from conspo.registry import register_task
from conspo.tasks.answers import FileProblems, answers_match, extract_answer
from conspo.tasks.base import HELD_OUT_FRACTION, Example, TaskParams, is_held_out

__all__ = ["JsonlTask", "answers_match", "extract_answer", "load_jsonl", "split_rows"]


class JsonlParams(TaskParams):
    path: str = Field(
        min_length=1,
        description="The training file: a path inside the data roots (a worker reads only from"
        " them; relative paths are looked up in each root).",
    )
    eval_path: str | None = Field(
        None,
        description="The held-out file, likewise (default: a hashed split of `path`).",
    )

    data_paths: ClassVar[tuple[str, ...]] = ("path", "eval_path")


@register_task(
    "jsonl",
    params=JsonlParams,
    description="Your own file of {prompt, answer} lines, verified as math answers.",
)
class JsonlTask(FileProblems):
    name = "jsonl"

    def __init__(self, params: JsonlParams, files: DataFiles) -> None:
        rows = load_jsonl(files, params.path)
        if params.eval_path:
            self.train, self.held_out = rows, load_jsonl(files, params.eval_path)
        else:
            self.train, self.held_out = split_rows(rows)
        if not self.train:
            raise ValueError(f"{params.path}: no training rows")


def load_jsonl(files: DataFiles, name: str) -> list[Example]:
    """The {prompt, answer} rows of the file ``name``, read through ``files`` (roots, cap)."""
    rows = []
    for lineno, line in enumerate(files.read_text(name).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            rows.append(Example(str(obj["prompt"]), str(obj["answer"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{name}:{lineno}: expected {{prompt, answer}} ({exc})") from None
    return rows


def split_rows(rows: list[Example]) -> tuple[list[Example], list[Example]]:
    """Hash-based held-out split; a file too small to get one by hash gives up its last row."""
    held = [r for r in rows if is_held_out(r.prompt, HELD_OUT_FRACTION)]
    train = [r for r in rows if not is_held_out(r.prompt, HELD_OUT_FRACTION)]
    if not held and len(train) > 1:
        held = [train.pop()]
    return train, held
