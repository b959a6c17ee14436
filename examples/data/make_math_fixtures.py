"""Write the math fixtures under examples/data/math/ (deterministic: the same files every run).

    PYTHONPATH=. python examples/data/make_math_fixtures.py

Small synthetic stand-ins for the real datasets' formats (conspo/tasks/math_fixtures.py draws them),
written here rather than downloaded:

* gsm8k.jsonl, gsm8k.parquet: GSM8K-style word problems, {question, answer: "...#### n"};
* math.parquet, math_disk/ (a ``save_to_disk`` DatasetDict, splits train and test): MATH-style
  {problem, solution ending in \\boxed{n}, answer};
* benchmark.jsonl: an AIME / MATH500-style benchmark, {problem, answer};
* easy.jsonl: one-step arithmetic word problems with small answers, {question, answer}: what the
  built-in tiny-chat-math is warm-started on (conspo/models/catalog.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from conspo.tasks.math_fixtures import fixture_sets

OUT = Path(__file__).parent / "math"


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    from datasets import Dataset, DatasetDict

    sets = fixture_sets()
    OUT.mkdir(parents=True, exist_ok=True)
    write_jsonl(OUT / "gsm8k.jsonl", sets["gsm8k"])
    Dataset.from_list(sets["gsm8k"]).to_parquet(OUT / "gsm8k.parquet")
    math = sets["math"]
    Dataset.from_list(math).to_parquet(OUT / "math.parquet")
    shutil.rmtree(OUT / "math_disk", ignore_errors=True)
    splits = {"train": Dataset.from_list(math[:120]), "test": Dataset.from_list(math[120:])}
    DatasetDict(splits).save_to_disk(OUT / "math_disk")
    write_jsonl(OUT / "benchmark.jsonl", sets["benchmark"])
    write_jsonl(OUT / "easy.jsonl", sets["easy"])


if __name__ == "__main__":
    main()
