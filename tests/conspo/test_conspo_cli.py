"""``python -m conspo``: task parameters on the command line, resuming a run of an older form."""

import json

import pytest

from conspo.cli import key_value, main, same_config
from conspo.config import RunConfig


def test_task_params_are_given_as_key_value():
    assert key_value("digits=2") == ("digits", 2)
    assert key_value("operators=*") == ("operators", "*")  # not JSON: kept as text
    assert key_value("eval_path=null") == ("eval_path", None)


def test_sft_refuses_bad_task_params_naming_them(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sft", "--task", "arith", "--param", "digits=0", "--param", "x=1", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "params.digits" in err and "params.x" in err and not out.exists()


def test_sft_task_choices_come_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--task", "sudoku", "--out", "x"])
    assert "arith" in capsys.readouterr().err


def test_a_run_directory_of_the_flat_task_form_still_resumes(tmp_path):
    cfg = RunConfig.model_validate({"task": {"name": "arith", "params": {"digits": 2}}})
    old = cfg.model_dump(mode="json")
    old["task"] = {"name": "arith", "digits": 2, "operators": "+-", "num_operands": 2,
                   "path": None, "eval_path": None, "eval_size": 64}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert same_config(tmp_path / "config.json", cfg)
    other = cfg.model_copy(update={"steps": cfg.steps + 1})
    assert not same_config(tmp_path / "config.json", other)
