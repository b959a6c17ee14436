"""What several job kinds' parameter models share: the local dataset a kind trains on."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from conspo.input_checks import Label


class DatasetParams(BaseModel):
    """Base of the parameters of a kind that trains on a local dataset named by ``path`` (sft's
    problems, dpo's pairs: each kind's description says what its rows hold).

    ``path`` is checked at submit time like a task's data files (``backend.runs.inputs`` reads
    ``data_paths``), and the kind reads it through ``DataFiles.check_path``: a directory may
    hold the dataset (``dataset_dirs``).
    """

    model_config = ConfigDict(extra="forbid")
    data_paths: ClassVar[tuple[str, ...]] = ("path",)
    dataset_dirs: ClassVar[bool] = True

    path: Label | None = Field(
        None,
        max_length=1000,
        description="A local dataset (parquet, jsonl, json, arrow, or a save_to_disk directory)"
        " inside the data roots, holding what the kind trains on (its description says which"
        " columns).",
    )
