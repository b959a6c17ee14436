"""conspo.tasks.datasets: every fixture format, field mapping (auto, named, dotted, chat messages,
GSM8K and boxed answers) and errors that name the file and the field."""

import json
import os
from pathlib import Path

import pytest

from conspo.access import DataFiles, DatasetTooLarge, Unavailable
from conspo.config import DatasetFields
from conspo.tasks.datasets import load_problems

FIXTURES = Path(__file__).parents[2] / "examples" / "data" / "math"
FIELDS = DatasetFields()


@pytest.mark.parametrize(
    ("name", "rows", "first_answer"),
    [
        ("gsm8k.jsonl", 200, None),
        ("gsm8k.parquet", 200, None),
        ("math.parquet", 150, None),
        ("math_disk", 120, None),
        ("benchmark.jsonl", 40, None),
        ("easy.jsonl", 400, None),
    ],
)
def test_every_fixture_format_loads(name, rows, first_answer):
    problems = load_problems(DataFiles(roots=(FIXTURES,)), name, FIELDS)
    assert len(problems) == rows
    assert all(p.prompt and p.answer for p in problems)


def test_gsm8k_answers_are_the_number_after_the_hashes():
    jsonl = load_problems(DataFiles(), str(FIXTURES / "gsm8k.jsonl"), FIELDS)
    parquet = load_problems(DataFiles(), str(FIXTURES / "gsm8k.parquet"), FIELDS)
    assert jsonl == parquet
    raw = json.loads((FIXTURES / "gsm8k.jsonl").read_text().splitlines()[0])
    assert raw["answer"].endswith("#### " + jsonl[0].answer) and jsonl[0].answer.isdigit()
    assert jsonl[0].prompt == raw["question"]


def test_a_solution_gives_its_last_boxed_answer(tmp_path):
    from datasets import Dataset

    rows = [{"problem": "p", "solution": "First \\boxed{1}, then $\\boxed{\\frac{1}{2}}$."}]
    Dataset.from_list(rows).to_parquet(tmp_path / "s.parquet")
    [problem] = load_problems(DataFiles(), str(tmp_path / "s.parquet"), FIELDS)
    assert problem.answer == "\\frac{1}{2}"
    named = DatasetFields(answer="auto", solution="solution")
    assert load_problems(DataFiles(), str(tmp_path / "s.parquet"), named) == [problem]


def test_dapo_style_chat_prompts_and_nested_ground_truth(tmp_path):
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "What is 6*7?"},
            ],
            "reward_model": {"ground_truth": "42", "style": "rule"},
        }
    ]
    (tmp_path / "dapo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    [auto] = load_problems(DataFiles(), str(tmp_path / "dapo.jsonl"), FIELDS)
    named = DatasetFields(question="prompt", answer="reward_model.ground_truth")
    [explicit] = load_problems(DataFiles(), str(tmp_path / "dapo.jsonl"), named)
    assert auto.prompt == explicit.prompt == "What is 6*7?"
    assert auto.answer == explicit.answer == "42"


def test_a_directory_of_parquet_shards_and_an_arrow_file(tmp_path):
    from datasets import Dataset

    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        Dataset.from_list([{"query": f"q{i}", "final_answer": str(i)}]).to_parquet(
            shards / f"part-{i}.parquet"
        )
    problems = load_problems(DataFiles(), str(shards), FIELDS)
    assert [(p.prompt, p.answer) for p in problems] == [("q0", "0"), ("q1", "1")]
    arrow = next((FIXTURES / "math_disk" / "test").glob("*.arrow"))
    assert len(load_problems(DataFiles(), str(arrow), FIELDS)) == 30


def test_errors_name_the_file_and_the_field(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"a": 1, "b": 2}) + "\n")
    with pytest.raises(ValueError, match=r"x.jsonl: no column 'question' \(columns: a, b\)"):
        load_problems(DataFiles(), str(path), DatasetFields(question="question"))
    with pytest.raises(ValueError, match=r"x.jsonl: no question column .*fields.question"):
        load_problems(DataFiles(), str(path), FIELDS)
    with pytest.raises(ValueError, match=r"x.jsonl: no column 'a.b'"):
        load_problems(DataFiles(), str(path), DatasetFields(question="a", answer="a.b"))
    with pytest.raises(ValueError, match=r"math_disk: no split 'validation'"):
        load_problems(DataFiles(), str(FIXTURES / "math_disk"), FIELDS, "validation")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"x.csv: unknown format"):
        load_problems(DataFiles(), str(tmp_path / "x.csv"), FIELDS)


def test_roots_cap_and_symlinks_bound_files_and_directories(tmp_path):
    files = DataFiles(roots=(FIXTURES,))
    with pytest.raises(Unavailable):
        load_problems(files, "../math/../../../pyproject.toml", FIELDS)
    with pytest.raises(Unavailable):
        load_problems(files, str(tmp_path), FIELDS)
    small = DataFiles(roots=(FIXTURES,), max_bytes=10_000)
    with pytest.raises(DatasetTooLarge):
        load_problems(small, "math_disk", FIELDS)  # the directory's total is over the cap
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(FIXTURES / "easy.jsonl", linked / "easy.jsonl")
    with pytest.raises(Unavailable):
        DataFiles(roots=(tmp_path,)).check_path("linked")


def test_loading_writes_no_cache_outside_a_temp_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    load_problems(DataFiles(), str(FIXTURES / "gsm8k.parquet"), FIELDS)
    assert not (tmp_path / "hf-cache").exists()
