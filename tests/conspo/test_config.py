import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from conspo.config import RunConfig, load_yaml
from conspo.registry import get_objective, get_task, objective_names, task_names

ROOT = Path(__file__).resolve().parents[2]


def error_locs(data: dict) -> list[tuple]:
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(data)
    return [tuple(e["loc"]) for e in info.value.errors()]


def test_defaults_resolve_the_algorithm_params():
    cfg = RunConfig()
    assert cfg.algorithm == "conspo"
    assert cfg.params["tau"] == 10.0 and cfg.params["margin_max"] == 0.01
    assert cfg.params["margin_warmup"] == 0.3


def test_presets_carry_their_own_defaults():
    dapo = RunConfig(algorithm="dapo")
    assert dapo.params["clip_high"] == 0.28 and dapo.params["loss_agg"] == "token-mean"
    assert dapo.params["refill_groups"] is True
    dr = RunConfig(algorithm="dr_grpo")
    assert dr.params["scale_rewards"] == "none"
    assert dr.params["loss_agg"] == "seq-mean-token-sum-norm"
    # user values override preset defaults
    assert RunConfig(algorithm="dapo", params={"clip_high": 0.3}).params["clip_high"] == 0.3


@pytest.mark.parametrize(
    "data, loc",
    [
        ({"algorithm": "trpo"}, ("algorithm",)),
        ({"params": {"tau": 0}}, ("params", "tau")),
        ({"params": {"taux": 1}}, ("params", "taux")),
        ({"algorithm": "grpo", "params": {"loss_agg": "sum"}}, ("params", "loss_agg")),
        ({"sampling": {"group_size": 1}}, ("sampling", "group_size")),
        ({"task": {"name": "sudoku"}}, ("task", "name")),
        ({"task": {"name": "jsonl"}}, ("task", "params", "path")),
        ({"task": {"params": {"operators": "+/"}}}, ("task", "params", "operators")),
        (
            {"task": {"name": "countdown", "params": {"operators": "+"}}},
            ("task", "params", "operators"),
        ),
        ({"task": {"eval_size": 0}}, ("task", "eval_size")),
        ({"steps": 0}, ("steps",)),
        ({"unknown_section": {}}, ("unknown_section",)),
    ],
)
def test_invalid_values_name_their_field(data, loc):
    assert loc in error_locs(data)


def test_unknown_algorithm_lists_valid_ones():
    with pytest.raises(ValidationError) as info:
        RunConfig(algorithm="trpo")
    message = str(info.value)
    for name in objective_names():
        assert name in message


def test_unknown_task_lists_valid_ones():
    with pytest.raises(ValidationError) as info:
        RunConfig(task={"name": "sudoku"})
    message = str(info.value)
    for name in task_names():
        assert name in message


def test_task_params_resolve_to_the_tasks_defaults():
    assert RunConfig().task.params == get_task("arith").params().model_dump()
    countdown = RunConfig(task={"name": "countdown", "params": {"digits": 2}}).task.params
    assert countdown == {**get_task("countdown").params().model_dump(), "digits": 2}


def test_task_params_errors_come_with_all_other_errors_in_one_response():
    locs = error_locs(
        {
            "steps": 0,
            "params": {"tau": -1},
            "sampling": {"group_size": 1},
            "task": {"eval_size": 0, "params": {"digits": 9, "num_operand": 3}},
        }
    )
    assert set(locs) == {
        ("steps",),
        ("params", "tau"),
        ("sampling", "group_size"),
        ("task", "eval_size"),
        ("task", "params", "digits"),
        ("task", "params", "num_operand"),
    }


@pytest.mark.parametrize(
    "flat, params",
    [
        # a YAML file of the old form
        (
            {"name": "arith", "digits": 2, "operators": "+-*", "num_operands": 3},
            {"digits": 2, "operators": "+-*", "num_operands": 3},
        ),
        (
            {"name": "jsonl", "path": "t.jsonl", "eval_path": "e.jsonl"},
            {"path": "t.jsonl", "eval_path": "e.jsonl"},
        ),
        # resolved configs stored in the database then: every task's fields, unused ones too
        (
            {"name": "arith", "digits": 1, "operators": "+", "num_operands": 2, "path": None,
             "eval_path": None, "eval_size": 64},
            {"digits": 1, "operators": "+", "num_operands": 2},
        ),
        (
            {"name": "countdown", "digits": 1, "operators": "+-", "num_operands": 3, "path": None,
             "eval_path": None, "eval_size": 64},
            {"digits": 1, "num_operands": 3},
        ),
        (
            {"name": "jsonl", "digits": 1, "operators": "+-", "num_operands": 2, "path": "t.jsonl",
             "eval_path": None, "eval_size": 64},
            {"path": "t.jsonl", "eval_path": None},
        ),
    ],
)  # fmt: skip
def test_the_flat_task_form_of_older_configs_is_accepted(flat, params):
    cfg = RunConfig.model_validate({"task": flat})
    assert cfg.task.name == flat["name"] and cfg.task.params == params
    assert RunConfig.model_validate(cfg.model_dump()) == cfg


def test_the_flat_task_form_still_refuses_unknown_keys():
    assert ("task", "params", "digit") in error_locs({"task": {"name": "arith", "digit": 2}})
    locs = error_locs({"task": {"name": "arith", "operators": "/"}})
    assert locs == [("task", "params", "operators")]


def test_old_yaml_files_load(tmp_path):
    (tmp_path / "old.yaml").write_text(
        "task:\n  name: arith\n  digits: 2\n  num_operands: 3\n  eval_size: 16\n"
    )
    cfg = RunConfig.from_file(tmp_path / "old.yaml")
    assert cfg.task.eval_size == 16
    assert cfg.task.params == {"digits": 2, "operators": "+-", "num_operands": 3}


def test_yaml_and_json_load(tmp_path):
    (tmp_path / "a.yaml").write_text("algorithm: grpo\nsteps: 7\nparams:\n  clip_high: 0.25\n")
    (tmp_path / "a.json").write_text(json.dumps({"algorithm": "grpo", "steps": 7}))
    y = RunConfig.from_file(tmp_path / "a.yaml")
    j = RunConfig.from_file(tmp_path / "a.json")
    assert y.steps == j.steps == 7
    assert y.params["clip_high"] == 0.25 and j.params["clip_high"] == 0.2


def test_registry_refuses_a_second_function_under_one_name():
    from conspo.registry import register_objective

    registered = get_objective("grpo")
    with pytest.raises(ValueError, match="already registered"):

        @register_objective("grpo", params=registered.params, description="x")
        def other(batch, params):  # pragma: no cover - never called
            return None


def test_params_errors_come_with_section_errors_in_one_response():
    locs = error_locs({"sampling": {"group_size": 1}, "params": {"tau": -1, "margin": "up"}})
    assert ("sampling", "group_size") in locs
    assert ("params", "tau") in locs and ("params", "margin") in locs


def test_unknown_algorithm_is_reported_beside_other_errors():
    locs = error_locs({"algorithm": "trpo", "steps": 0})
    assert ("algorithm",) in locs and ("steps",) in locs


def test_a_resolved_config_round_trips_unchanged():
    cfg = RunConfig(algorithm="dapo", params={"clip_low": 0.1}, steps=3)
    again = RunConfig.model_validate(cfg.model_dump())
    assert again == cfg
    assert RunConfig.model_validate(cfg) is cfg


def yaml_blocks(path: Path) -> list[str]:
    """The README's YAML blocks that are run configs (a study's, with arms, is validated as a
    study by tests/studies/test_study_examples.py)."""
    blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.S)
    return [b for b in blocks if "arms" not in (load_yaml(b) or {})]


@pytest.mark.parametrize(
    "text",
    [p.read_text() for p in sorted((ROOT / "examples").glob("*.yaml"))]
    + yaml_blocks(ROOT / "README.md"),
)
def test_the_configs_of_the_examples_and_the_readme_validate(text):
    RunConfig.model_validate(load_yaml(text))  # as RunConfig.from_file reads them


def _number_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _number_fields(info.annotation, f"{prefix}{name}.")
        elif info.annotation in (int, float):
            yield f"{prefix}{name}", info


def test_every_number_of_the_config_is_bounded_on_both_sides():
    """A number without bounds is stored by SQLite and refused by PostgreSQL (or trained on
    with 1e300): every int and float field, including ones added later, has both bounds."""
    unbounded = []
    for name, info in _number_fields(RunConfig):
        kinds = {type(m).__name__ for m in info.metadata}
        if not ({"Ge", "Gt"} & kinds and {"Le", "Lt"} & kinds):
            unbounded.append(name)
    assert not unbounded, f"fields without a lower and an upper bound: {unbounded}"


@pytest.mark.parametrize(
    "data, loc",
    [
        ({"sampling": {"temperature": math.nan}}, ("sampling", "temperature")),
        ({"optim": {"max_grad_norm": math.inf}}, ("optim", "max_grad_norm")),
        ({"params": {"tau": math.inf}}, ("params", "tau")),  # params: the registered model's
        ({"params": {"beta": -math.inf}}, ("params", "beta")),
        ({"params": {"tau": {"a": "\ud800"}}}, ("params", "tau")),
        ({"task": {"name": "jsonl", "params": {"path": "a\x00"}}}, ("task", "params", "path")),
        ({"task": {"name": "jsonl", "path": "\ud800"}}, ("task", "params", "path")),  # flat form
        ({"params": {"x": json.loads("[" * 33 + "]" * 33)}}, ("params", "x")),
        ({"name": "run\x1b[2J"}, ("name",)),
        ({"model": {"name": "tiny\x00"}}, ("model", "name")),
    ],
)
def test_what_json_or_a_database_cannot_hold_is_refused_at_its_field(data, loc):
    assert loc in error_locs(data)


@pytest.mark.parametrize("buffer,max_new_tokens", [(8, 6), (6, 6)])
def test_an_overlong_buffer_as_long_as_the_response_cap_is_refused(buffer, max_new_tokens):
    """A buffer >= max_new_tokens would penalise every answer, a correct 2-token one too."""
    data = {
        "algorithm": "dapo",
        "params": {"overlong_buffer": buffer},
        "sampling": {"max_new_tokens": max_new_tokens},
    }
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(data)
    [error] = info.value.errors()
    assert error["loc"] == ("params", "overlong_buffer")
    assert "sampling.max_new_tokens" in error["msg"] and "params.overlong_buffer" in error["msg"]
    # DAPO's default buffer (8), not given, shrinks to fit a shorter cap; 0 turns shaping off.
    RunConfig.model_validate({"algorithm": "dapo", "sampling": {"max_new_tokens": 8}})
    RunConfig.model_validate({**data, "params": {"overlong_buffer": 0}})
    RunConfig.model_validate({**data, "params": {"overlong_buffer": max_new_tokens - 1}})


def test_params_are_validated_once_and_passed_typed(monkeypatch):
    """Validating a config makes each registered params model once (the objective's, the job
    kind's, the task's, each reward's); the typed accessors hand out those instances instead of
    validating the dicts again, and validate anew only when a dict changed."""
    from conspo.jobs.dpo import DPOParams
    from conspo.objectives.conspo import ConSPOParams

    calls: list[str] = []
    for model in (ConSPOParams, DPOParams):
        original = model.model_validate.__func__  # type: ignore[attr-defined]

        def counted(cls, *args, _original=original, **kwargs):
            calls.append(cls.__name__)
            return _original(cls, *args, **kwargs)

        monkeypatch.setattr(model, "model_validate", classmethod(counted))
    cfg = RunConfig.model_validate({"algorithm": "conspo", "params": {"tau": 3.0}})
    dpo = RunConfig.model_validate({"kind": "dpo", "kind_params": {"from_run": 7}})
    # the rl config's; dpo trains no algorithm, so it has no ConSPO parameters to validate
    assert calls.count("ConSPOParams") == 1 and calls.count("DPOParams") == 1
    params = cfg.objective_params()
    assert isinstance(params, ConSPOParams) and params.tau == 3.0
    assert cfg.objective_params() is params and cfg.task.task_params() is cfg.task.task_params()
    kind_params = dpo.typed("kind_params", DPOParams)
    assert kind_params.from_run == 7 and dpo.job_params() is kind_params
    assert calls.count("ConSPOParams") == 1 and calls.count("DPOParams") == 1  # none more
    cfg.params["tau"] = 5.0  # a changed dict is validated again
    assert cfg.objective_params().tau == 5.0
    copied = cfg.model_copy(update={"params": {**cfg.params, "tau": 6.0}})
    assert copied.objective_params().tau == 6.0 and cfg.objective_params().tau == 5.0
    # the cache never makes equal configs differ
    assert RunConfig.model_validate(cfg.model_dump()) == cfg


def test_the_default_overlong_buffer_fits_a_short_response_cap() -> None:
    """Issue 26 item 10: choosing DAPO in the form (max_new_tokens 6) gave an invalid config:
    its default 8-token buffer covered every answer. The default, not given, shrinks to a quarter
    of the cap (the form sends only the parameters that differ from the defaults); a buffer given
    explicitly is still refused when it does not fit."""
    cfg = RunConfig.model_validate({"algorithm": "dapo", "sampling": {"max_new_tokens": 6}})
    assert cfg.params["overlong_buffer"] == 1
    assert [(r.name, r.params) for r in cfg.rewards][-1] == ("length", {"buffer": 1})
    assert RunConfig.model_validate({"algorithm": "dapo"}).params["overlong_buffer"] == 8
    with pytest.raises(ValidationError, match="must be smaller than sampling.max_new_tokens"):
        short = {"max_new_tokens": 6}
        RunConfig.model_validate(
            {"algorithm": "dapo", "sampling": short, "params": {"overlong_buffer": 8}}
        )


# Issue 49: a config's types are JSON's, strictly, wherever it enters (the API, the CLI, the
# library), in the sections and in every registered params model alike.
@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"steps": True}, ("steps",)),  # lax mode trained one step
        ({"steps": "5"}, ("steps",)),
        ({"steps": 5.5}, ("steps",)),
        ({"optim": {"lr": "3e-5"}}, ("optim", "lr")),
        ({"model": {"gradient_checkpointing": 1}}, ("model", "gradient_checkpointing")),
        ({"model": {"step": "3"}}, ("model", "step", "constrained-int")),
        ({"params": {"tau": "10"}}, ("params", "tau")),
        ({"params": {"refill_groups": 1}}, ("params", "refill_groups")),
        ({"task": {"name": "arith", "params": {"digits": "2"}}}, ("task", "params", "digits")),
        ({"task": {"name": "arith", "digits": True}}, ("task", "params", "digits")),
        (
            {"rewards": [{"name": "length", "params": {"buffer": "2"}}]},
            ("rewards", 0, "params", "buffer"),
        ),
        ({"kind": "sft", "kind_params": {"epochs": "2"}}, ("kind_params", "epochs")),
        (
            {"eval": {"benchmarks": [{"name": "b", "source": "humaneval", "k": "4"}]}},
            ("eval", "benchmarks", 0, "k"),
        ),
    ],
)
def test_config_types_are_strict(data, loc):
    assert loc in error_locs(data)


def test_json_numbers_keep_working():
    """JSON has one kind of number: an integer is a float field's value, and a whole float an
    integer field's (JSON Schema counts 5.0 as an integer; Python's json writes it so)."""
    cfg = RunConfig.model_validate(
        {
            "steps": 5.0,
            "optim": {"lr": 1},
            "params": {"tau": 10, "max_refill_rounds": 2.0},
            "model": {"step": 3.0},
            "task": {"name": "arith", "params": {"digits": 2.0}},
            "eval": {"benchmarks": [{"name": "b", "source": "humaneval", "k": 2.0}]},
        }
    )
    assert (cfg.steps, cfg.model.step, cfg.eval.benchmarks[0].k) == (5, 3, 2)
    assert type(cfg.steps) is int and type(cfg.params["max_refill_rounds"]) is int
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float
    assert cfg.params["tau"] == 10.0 and type(cfg.params["tau"]) is float
    assert cfg.task.params["digits"] == 2 and type(cfg.task.params["digits"]) is int


def test_yaml_exponents_without_a_dot_are_numbers(tmp_path):
    """PyYAML (YAML 1.1) reads 3e-5 as text; a strict config would refuse the usual way of
    writing a learning rate, so config files read it as YAML 1.2 does."""
    (tmp_path / "lr.yaml").write_text("optim:\n  lr: 3e-5\nparams:\n  beta: 1E-3\n")
    cfg = RunConfig.from_file(tmp_path / "lr.yaml")
    assert cfg.optim.lr == 3e-5 and cfg.params["beta"] == 1e-3
    (tmp_path / "text.yaml").write_text("name: 1e5x\n")  # not a number: still text
    assert RunConfig.from_file(tmp_path / "text.yaml").name == "1e5x"


def test_a_kind_that_trains_no_algorithm_carries_none():
    """Issue 49: SFT runs stored ``algorithm: conspo`` and ConSPO's parameters, so a search for
    ConSPO runs found them. A kind whose registration lacks the "algorithm" section has none."""
    from conspo.config import with_overrides

    for kind in ("sft", "distill", "dpo"):
        given = {"kind": kind, "algorithm": "grpo", "params": {"clip_high": 0.3}}
        if kind == "dpo":
            given["kind_params"] = {"path": "pairs.jsonl"}
        cfg = RunConfig.model_validate(given)
        assert (cfg.algorithm, cfg.params, cfg.objective_params()) == (None, {}, None), kind
        stored = cfg.model_dump(mode="json")
        assert stored["algorithm"] is None and stored["params"] == {}
        assert RunConfig.model_validate(stored) == cfg
    # a kind that trains one takes null as its default; a clone into rl starts from it
    assert RunConfig.model_validate({"algorithm": None}).algorithm == "conspo"
    sft = RunConfig.model_validate({"kind": "sft"}).model_dump(mode="json")
    rl = RunConfig.model_validate(with_overrides(sft, {"kind": "rl"}))
    assert rl.algorithm == "conspo" and rl.params["tau"] == 10.0
