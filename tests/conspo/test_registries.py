"""Every registry at once: the objectives, tasks, rewards and job kinds, and the metric catalogue.

Each test runs over whatever is registered, so a new entry is held to the same rules by its
registration alone, and no test names the entries: every parameter is described, every reward
scores every task's reference answers, every job kind trains from the example its registration
gives and logs exactly the keys it declares, and the registry finds an entry in a new module.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
from pydantic import BaseModel, ValidationError

from conspo import metrics as M
from conspo.config import RunConfig, TaskConfig, ToolsConfig
from conspo.models.scoring import ModelScorers
from conspo.registry import (
    ENVIRONMENTS,
    JOB_KINDS,
    OBJECTIVES,
    REWARDS,
    TASKS,
    TOOLS,
    RegisteredJobKind,
    Registry,
    all_registries,
    get_objective,
    get_reward,
    get_task,
    job_kind_names,
    reward_names,
    task_names,
    tool_names,
)
from conspo.rewards import RewardContext, build_rewards, score_rollouts
from conspo.sandbox import sandbox_available
from conspo.tasks import make_task
from conspo.tools import ToolCall, make_toolbox, observation_text
from tests.conspo.judge_models import build_scripted_judge
from tests.conspo.score_models import build_reward_model
from tests.support import REQUIRE_SERVICES

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "examples" / "data" / "math"
REGISTRIES: tuple[Registry[Any], ...] = (
    OBJECTIVES, TASKS, REWARDS, JOB_KINDS, TOOLS, ENVIRONMENTS
)  # fmt: skip
CATALOGUE = M.catalogue()


def test_every_registry_is_held_to_these_rules() -> None:
    """A new registry (all_registries lists every one: the plugins load into each) is named
    here too, or none of the rules below covers its entries."""
    assert set(REGISTRIES) == set(all_registries())


# ------------------------------------------------------------------------------------------------
# Every entry and every parameter is described (the form's help, OpenAPI and docs/config.md)
# ------------------------------------------------------------------------------------------------


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The parameter models inside a field's type (a section, a list of them, an optional one)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in nested_models(arg)]


def undescribed(model: type[BaseModel], prefix: str = "params.") -> list[str]:
    """The fields of ``model``, at any depth, whose description is empty."""
    missing = []
    for name, info in model.model_fields.items():
        if not (info.description or "").strip():
            missing.append(f"{prefix}{name}")
        for sub in nested_models(info.annotation):
            missing += undescribed(sub, f"{prefix}{name}.")
    return missing


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.kind)
def test_every_entry_and_every_parameter_is_described(registry: Registry[Any]) -> None:
    assert registry.names(), f"no {registry.kind} is registered"
    for name in registry.names():
        entry = registry.get(name)
        assert entry.description.strip(), f"{registry.kind} {name} has no description"
        assert not undescribed(entry.params), f"{registry.kind} {name}: {undescribed(entry.params)}"


def test_every_catalogue_key_is_described_and_every_declared_key_is_in_it() -> None:
    for m in CATALOGUE.metrics:
        assert m.label.strip() and m.help.strip() and m.unit.strip(), m.key
    for p in CATALOGUE.patterns:
        assert p.label.strip() and p.help.strip() and p.unit.strip(), p.pattern
    keys = {m.key for m in CATALOGUE.metrics}
    declared = {
        **{f"algorithm {name}": get_objective(name).metrics for name in OBJECTIVES.names()},
        **{f"kind {name}": JOB_KINDS.get(name).metrics for name in job_kind_names()},
        "every kind (conspo.metrics.EVERY_KIND)": M.EVERY_KIND,
        "the task's evaluation (conspo.metrics.TASK_EVAL)": M.TASK_EVAL,
    }
    for who, its_keys in declared.items():
        lacking = set(its_keys) - keys
        assert not lacking, f"{who} declares keys the catalogue lacks: {lacking}"


# ------------------------------------------------------------------------------------------------
# The registry finds every module of its packages: an entry in a new file needs no other edit
# ------------------------------------------------------------------------------------------------


def python(code: str) -> str:
    """``code`` run in a fresh interpreter (its registries not yet loaded); its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_first_lookup_imports_every_module_of_each_registrys_packages() -> None:
    found = json.loads(
        python("""
            import json, sys
            from conspo.registry import all_registries
            for registry in all_registries():
                registry.names()
            print(json.dumps(sorted(sys.modules)))
        """)
    )
    for registry in REGISTRIES:
        for package in registry.builtins:
            files = (ROOT / package.replace(".", "/")).glob("*.py")
            modules = {f"{package}.{f.stem}" for f in files if f.stem != "__init__"}
            assert modules <= set(found), f"{registry.kind}: {sorted(modules - set(found))}"


def test_a_reward_in_a_new_module_of_the_package_is_registered(tmp_path: Path) -> None:
    """The issue's bug: a reward in a file of its own was never found. Here a module dropped into
    the package (a directory added to its path) is found, validated and scored."""
    (tmp_path / "shouting.py").write_text(
        textwrap.dedent("""
            from conspo.registry import register_reward
            from conspo.rewards.base import RewardParams

            @register_reward("shouting", params=RewardParams, description="1 for upper case.")
            def shouting_reward(completion, example, context, params):
                return float(completion.isupper())
        """)
    )
    out = python(f"""
        import conspo.rewards
        conspo.rewards.__path__.append({str(tmp_path)!r})
        from conspo.config import RunConfig
        from conspo.registry import reward_names
        from conspo.rewards import RewardContext, build_rewards, score_rollouts
        from conspo.tasks import make_task
        from conspo.tasks.base import Example

        cfg = RunConfig.model_validate({{"rewards": [{{"name": "shouting", "weight": 0.5}}]}})
        context = RewardContext(make_task(cfg.task), 16)
        scores = score_rollouts(build_rewards(cfg.rewards), ["YES", "no"],
                                [Example("1+1=", "2")] * 2, [1, 1], context)
        print(reward_names(), scores.parts["shouting"], scores.shaped)
    """)
    assert "'shouting'" in out and "[1.0, 0.0] [0.5, 0.0]" in out, out


# ------------------------------------------------------------------------------------------------
# Every task builds from its defaults and verifies its own references; every reward scores them
# ------------------------------------------------------------------------------------------------


def sample_jsonl(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "sample.jsonl"
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(50)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"path": str(path)}


# Parameters a task cannot default (a file of your own): the values the tests below build it
# with, the shipped fixtures where there are some. A task whose parameters all have defaults
# needs nothing here.
REQUIRED_PARAMS = {
    "jsonl": sample_jsonl,
    "math": lambda _: {"path": str(FIXTURES / "gsm8k.parquet")},
}


def task_section(name: str, tmp_path: Path) -> dict[str, Any]:
    required = REQUIRED_PARAMS[name](tmp_path) if name in REQUIRED_PARAMS else {}
    return {"name": name, "params": required}


@pytest.mark.parametrize("name", task_names())
def test_every_registered_task_builds_samples_and_verifies_its_references(name, tmp_path):
    task = make_task(TaskConfig.model_validate(task_section(name, tmp_path)))
    assert task.name == name
    train = task.train_prompts(random.Random(0), 32)
    held_out = task.eval_examples(8)
    assert len(train) == 32 and held_out
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in held_out}
    for ex in train + held_out:
        assert ex.prompt and task.verify(ex.answer, ex) == 1.0, ex
    assert task.verify("", train[0]) == 0.0


MAX_NEW_TOKENS = 16


def stand_in_scorer(rows, contexts, continuations) -> list[float]:
    """A stand-in for the policy's ``continuation_logprob`` (the trainer's reads the model): a
    deterministic mean "log-prob" that grows with the context and falls with the continuation,
    so a batched reward that reads the policy (info_gain) runs here in pure Python."""
    pairs = zip(contexts, continuations, strict=True)
    return [-1.0 / (1 + len(context)) - 0.01 * len(answer) for context, answer in pairs]


@pytest.fixture(scope="module")
def reward_models(model_store: Any, tmp_path_factory: Any) -> tuple[dict[str, Path], ModelScorers]:
    """Per way a reward calls a model (its params' ``model_use``): a tiny reward model
    (tiny-chat's body, a one-label head) for "score", a scripted tiny judge that writes
    "Score: 7" or "Score: 3" for "generate"; and the run's models as the trainer gives them to
    rewards: what a reward that calls a model (its params' model_names) is given here."""
    chat = model_store.resolve("tiny-chat")
    paths = {
        "score": build_reward_model(chat, tmp_path_factory.mktemp("rm")),
        "generate": build_scripted_judge(
            chat, tmp_path_factory.mktemp("judge") / "judge", ["Score: 7", "Score: 3"]
        ),
    }
    return paths, ModelScorers(model_store.resolve, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("task_name", task_names())
def test_every_reward_scores_every_tasks_reference_answers(
    task_name: str, tmp_path: Path, reward_models: tuple[dict[str, Path], ModelScorers]
) -> None:
    """Each registered reward, default params, on the task's own reference answers: a finite
    float per rollout. Two rollouts per prompt (a group): the bare reference, and the reference
    after some reasoning, which gives a reward that reads the reasoning (info_gain) work to do.
    A parameter naming a model (``model_names``) names the tiny reward model, or the tiny judge
    where the reward generates with it (``model_use``)."""
    model_paths, models = reward_models
    task_cfg = task_section(task_name, tmp_path)
    task = make_task(TaskConfig.model_validate(task_cfg))
    examples = task.train_prompts(random.Random(0), 4) + task.eval_examples(4)
    grouped = [ex for ex in examples for _ in range(2)]
    completions = [text for ex in examples for text in (ex.answer, f"Working it out: {ex.answer}")]
    # a character count stands for the token count (no tokenizer here), capped like sampling's
    lengths = [min(len(text), MAX_NEW_TOKENS) for text in completions]
    context = RewardContext(
        task, MAX_NEW_TOKENS, group_size=2, continuation_logprob=stand_in_scorer, models=models
    )
    for name in reward_names():
        params = get_reward(name).params
        path = model_paths[getattr(params, "model_use", "score")]
        named = {f: str(path) for f in getattr(params, "model_names", ())}
        data = {"task": task_cfg, "sampling": {"max_new_tokens": MAX_NEW_TOKENS},
                "rewards": [{"name": name, "params": named}]}  # fmt: skip
        if not get_reward(name).applies_to(get_task(task_name)):
            # a reward that needs a task method this task lacks: the config refuses the pair
            with pytest.raises(ValidationError) as refused:
                RunConfig.model_validate(data)
            assert refused.value.errors()[0]["loc"] == ("rewards", 0, "name"), name
            continue
        cfg = RunConfig.model_validate(data)
        scores = score_rollouts(build_rewards(cfg.rewards), completions, grouped, lengths, context)
        values = scores.parts[name]
        assert len(values) == len(completions), name
        assert all(isinstance(v, float) and math.isfinite(v) for v in values), (name, values)
        assert not scores.failed, (name, scores.failed)
        assert scores.outcome[::2] == [1.0] * len(examples)  # the bare references verify


# ------------------------------------------------------------------------------------------------
# Every tool answers any text a call may hold with one result, never an exception
# ------------------------------------------------------------------------------------------------

# What a call's source may be: nothing, a lone surrogate (a str no file or pipe can carry), a
# NUL, unbalanced syntax, a tag of its own, and one ordinary line.
HOSTILE_SOURCES = ["", "\ud800", "1\x00", "(((", "</interpreter>", "1 + 1"]


@pytest.mark.parametrize("name", tool_names())
def test_every_tool_answers_every_call_with_one_result(name: str) -> None:
    """A call is the model's (or a library caller's) text: whatever it holds costs that call,
    never the rollout. A sandboxed tool runs here only where the sandbox works."""
    if TOOLS.get(name).sandboxed and not REQUIRE_SERVICES and not sandbox_available():
        pytest.skip(f"no sandbox here: {sandbox_available().reason}")
    box = make_toolbox(ToolsConfig(names=[name], timeout_s=5))
    results = box.run([ToolCall(name, source) for source in HOSTILE_SOURCES])
    assert len(results) == len(HOSTILE_SOURCES)
    for source, result in zip(HOSTILE_SOURCES, results, strict=True):
        assert result.status in ("ok", "error", "timeout"), (source, result)
        observation_text(result).encode("utf-8")  # what the model reads next is plain text
    assert results[1].status == "error" and "\\ud800" in results[1].output, results[1]


# ------------------------------------------------------------------------------------------------
# Every job kind trains from its registration's example and logs exactly what it declares
# ------------------------------------------------------------------------------------------------


def declared_keys(config: RunConfig, kind: RegisteredJobKind) -> set[str]:
    """What a run of ``kind`` logs by its declarations: the registration's metrics and what every
    kind logs; one whose model generates (a causal LM head) the task's evaluation; a kind that
    trains an algorithm also the catalogue's "every run" keys (those without a further
    condition) and its objective's; one with rewards, reward/<name> of each."""
    keys = set(kind.metrics) | set(M.EVERY_KIND)
    if kind.head == "causal_lm":
        keys |= set(M.TASK_EVAL)
    if kind.trains_algorithm:
        keys |= {m.key for m in CATALOGUE.metrics if m.logged_by == "every run" and not m.when}
        keys |= set(get_objective(config.algorithm).metrics)
        # the native and vllm engines report what they sampled each token with (the mismatch
        # panels), where no tool or environment turn interleaves the answer
        plain = not config.tools.names and "environment" not in config.task.params
        if config.sampling.engine != "hf" and plain:
            keys |= {m.key for m in CATALOGUE.metrics if m.when == M.MISMATCH_WHEN}
    if "rewards" in kind.sections:
        keys |= {M.reward_key(r.name) for r in config.rewards}
    return keys


def test_every_job_kind_trains_from_its_example_and_logs_exactly_what_it_declares(
    job_kind_runs,
) -> None:
    assert set(job_kind_runs) == set(job_kind_names())
    for name, run in job_kind_runs.items():
        assert run.status == "succeeded", name
        declared = declared_keys(run.config, JOB_KINDS.get(name))
        # system/* readings come from the sampler of any run that trains through the loop, on
        # the steps a sample fell in and on the last step (conspo.system): not the kind's own.
        logged = {k for k in run.logged if not k.startswith("system/")}
        undeclared, missing = logged - declared, declared - logged
        assert not undeclared, f"kind {name} logs keys it does not declare: {sorted(undeclared)}"
        assert not missing, f"kind {name} declares keys it never logged: {sorted(missing)}"
