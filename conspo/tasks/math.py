"""Math problems from a dataset file (GSM8K, MATH, DeepScaleR, DAPO-Math-17k, your own).

The dataset is read by ``conspo.tasks.datasets`` (parquet, jsonl, json, arrow or a ``save_to_disk``
directory; ``fields`` maps its columns), and a completion is verified as in the jsonl task: its
last \\boxed{} (else its last number) against the reference answer, numerically or by
math-verify. The prompt is the bare question; ``RunConfig.prompt`` renders it (template, chat).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from conspo.access import DataFiles
from conspo.config import DatasetFields
from conspo.registry import register_task
from conspo.tasks.answers import FileProblems
from conspo.tasks.base import TaskParams
from conspo.tasks.datasets import load_problems
from conspo.tasks.jsonl import split_rows


class MathParams(TaskParams):
    path: str = Field(
        min_length=1,
        description="The training dataset: a file (parquet, jsonl, json, arrow) or a directory"
        " (save_to_disk, parquet shards) inside the data roots.",
    )
    eval_path: str | None = Field(
        None,
        description="The held-out dataset, likewise, read with its 'test' split when it is a"
        " DatasetDict that has one (default: a hashed split of `path`).",
    )
    split: str = Field(
        "train", min_length=1, max_length=200, description="The split of a DatasetDict directory."
    )
    fields: DatasetFields = Field(
        default_factory=DatasetFields, description="Which columns hold the question and answer."
    )

    data_paths: ClassVar[tuple[str, ...]] = ("path", "eval_path")
    dataset_dirs: ClassVar[bool] = True


@register_task(
    "math",
    params=MathParams,
    description="Math problems from a dataset file (GSM8K, MATH, DeepScaleR, DAPO style),"
    " verified on the \\boxed{} answer.",
)
class MathTask(FileProblems):
    name = "math"

    def __init__(self, params: MathParams, files: DataFiles) -> None:
        rows = load_problems(files, params.path, params.fields, params.split)
        if params.eval_path:
            held_out = load_problems(files, params.eval_path, params.fields, ("test", params.split))
            self.train, self.held_out = rows, held_out
        else:
            self.train, self.held_out = split_rows(rows)
        if not self.train:
            raise ValueError(f"{params.path}: no training rows")
