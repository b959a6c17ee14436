"""The ``reward_model`` job kind (conspo/jobs/reward_model.py): the Bradley–Terry loss, a
held-out pair accuracy that learns, the exported checkpoint scoring as the run did (LoRA merged,
or full) and as the ``reward_model`` reward reads it, the pairs file refused by what is wrong
with it, and pairs from a finished run's rollouts, all on the tiny built-in models."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from conspo.access import DataFiles
from conspo.config import RunConfig
from conspo.jobs import prepare_inputs, train_job
from conspo.jobs.preferences import PAIRS_FILE, Pair, load_pairs
from conspo.jobs.reward_model import (
    RewardModelParams,
    bradley_terry_loss,
    pair_scores,
    split_by_prompt,
)
from conspo.models.export import export_merged
from conspo.models.loading import load_pretrained
from conspo.models.scoring import ModelScorers
from conspo.models.store import ModelStore
from conspo.sink import MemorySink
from conspo.tasks import make_task
from conspo.training.checkpoint import latest_checkpoint
from conspo.training.loop import step_seed
from tests.conspo.conftest import stand_in_rollouts

CPU = torch.device("cpu")


def arith_pairs(n: int) -> list[dict[str, str]]:
    """A learnable preference: the right sum over a wrong one (7 more), per distinct problem."""
    task = make_task(RunConfig.model_validate({"task": {"name": "arith"}}).task)
    rows, seen = [], set()
    for ex in task.train_prompts(random.Random(0), n):
        if ex.prompt not in seen:
            seen.add(ex.prompt)
            answer = str(ex.answer)
            rows.append({"prompt": ex.prompt, "chosen": answer, "rejected": str(int(answer) + 7)})
    return rows


def write_jsonl(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rm_config(kind_params: dict[str, object], **extra: object) -> RunConfig:
    return RunConfig.model_validate({
        "kind": "reward_model", "kind_params": kind_params, "steps": 2,
        "model": {"name": "tiny"}, "task": {"name": "arith", "eval_size": 2},
        "eval": {"every": 0, "pass_k": 1}, "checkpoint": {"every": 0}, **extra,
    })  # fmt: skip


def test_the_loss_is_bradley_terrys_mean_over_the_pairs() -> None:
    chosen, rejected = torch.tensor([2.0, 0.0, 0.5]), torch.tensor([1.0, 1.0, 0.5])
    # margins 1, −1, 0: −log σ(m) = log(1 + e^−m)
    expected = (math.log1p(math.exp(-1)) + math.log1p(math.exp(1)) + math.log(2)) / 3
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-6)


def test_held_out_prompts_are_never_trained_on_and_the_split_follows_the_seed() -> None:
    pairs = [Pair(f"q{i % 10}", f"good{i}", f"bad{i}") for i in range(30)]  # 10 prompts, 3 each
    train, held = split_by_prompt(pairs, 0.2, seed=1)
    assert len({p.prompt for p in held}) == 2 and len(held) == 6 and len(train) == 24
    assert not {p.prompt for p in held} & {p.prompt for p in train}
    assert split_by_prompt(pairs, 0.2, seed=1) == (train, held)
    assert {split_by_prompt(pairs, 0.2, seed=s)[1][0].prompt for s in range(20)} != {held[0].prompt}
    # A small fraction still holds one prompt out; 0 holds none.
    assert len({p.prompt for p in split_by_prompt(pairs, 0.01, 1)[1]}) == 1
    assert split_by_prompt(pairs, 0.0, 1) == (pairs, [])
    with pytest.raises(ValueError, match="kind_params.eval_fraction: holding out 1 of the 1"):
        split_by_prompt([Pair("q", "a", "b")], 0.1, 1)


def test_held_out_pair_accuracy_rises_above_chance(model_store: ModelStore, tmp_path: Path) -> None:
    pairs = write_jsonl(tmp_path / "prefs.jsonl", arith_pairs(80))
    config = rm_config(
        {"path": str(pairs), "eval_fraction": 0.3, "batch_size": 16},
        steps=20,
        model={"name": "tiny-arith"},
        optim={"lr": 3e-4},
    )
    sink = MemorySink()
    result = train_job(config, sink, workdir=tmp_path / "run", model_store=model_store)
    assert result.status == "succeeded"
    start, end = sink.steps[0].metrics, sink.steps[20].metrics
    # 19 held-out pairs: 17 right by chance has probability < 0.001
    assert end["eval/rm_accuracy"] >= 0.85, end
    assert end["eval/rm_margin"] > start["eval/rm_margin"] + 1
    assert "eval/accuracy" not in end  # no generated answers: the task's eval is not this kind's
    assert {"rm/accuracy", "rm/margin", "optim/loss"} <= sink.steps[1].metrics.keys()


@pytest.mark.parametrize("lora_rank", [8, 0], ids=["lora", "full"])
def test_the_exported_checkpoint_scores_as_the_run_did(
    model_store: ModelStore, tmp_path: Path, lora_rank: int
) -> None:
    """The export (LoRA merged into its base; a full checkpoint copied) loads with
    AutoModelForSequenceClassification and gives the held-out pairs the margin the run logged
    at its last step; the reward_model reward's loader reads it alike."""
    pairs = write_jsonl(tmp_path / "prefs.jsonl", arith_pairs(24))
    config = rm_config(
        {"path": str(pairs), "eval_fraction": 0.25},
        steps=3,
        model={"name": "tiny-arith", "lora": {"rank": lora_rank}},
        optim={"lr": 1e-3},
    )
    sink = MemorySink()
    workdir = tmp_path / "run"
    train_job(config, sink, workdir=workdir, model_store=model_store)
    logged = sink.steps[3].metrics
    found = latest_checkpoint(workdir)
    assert found is not None and found[0] == 3
    out = export_merged(found[1], None, tmp_path / "exported")
    assert (out / "adapter_config.json").exists() is False

    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id
    params = config.typed("kind_params", RewardModelParams)
    every = load_pairs(params, DataFiles(), workdir, lambda q: q)
    _, held = split_by_prompt(every, 0.25, step_seed(config.seed, 0, "reward_model/split"))
    with torch.no_grad():
        chosen, rejected = pair_scores(model, tokenizer, held, params.max_tokens)
    margin = chosen - rejected
    assert float(margin.mean()) == pytest.approx(logged["eval/rm_margin"], abs=1e-4)
    assert float((margin > 0).float().mean()) == logged["eval/rm_accuracy"]
    assert abs(logged["eval/rm_margin"]) > 1e-3  # trained: a head left random would not pass

    scorers = ModelScorers(Path, CPU, torch.float32)  # the reward's loader, by path
    scores = scorers.score(
        str(out),
        [p.prompt for p in held],
        [p.chosen for p in held],
        max_tokens=params.max_tokens,
        batch_size=3,
        deadline=float("inf"),
    )
    assert scores == pytest.approx(chosen.tolist(), abs=1e-5)


def test_a_pairs_file_is_refused_by_its_name_column_and_row(tmp_path: Path) -> None:
    files = DataFiles()

    def refusal(name: str, rows: list[dict[str, object]] | None) -> str:
        path = tmp_path / name
        path.write_text("" if rows is None else "".join(json.dumps(r) + "\n" for r in rows))
        params = RewardModelParams(path=str(path))
        with pytest.raises(ValueError) as caught:
            load_pairs(params, files, tmp_path, lambda q: q)
        return str(caught.value)

    message = refusal("lacking.jsonl", [{"prompt": "1+1=", "chosen": "2"}])
    assert "kind_params.path" in message and "lacking.jsonl" in message
    assert "['rejected']" in message
    message = refusal("empty.jsonl", None)
    assert "kind_params.path" in message and "empty.jsonl" in message
    rows: list[dict[str, object]] = [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        {"prompt": "2+2=", "chosen": "4", "rejected": None},
    ]
    message = refusal("holes.jsonl", rows)
    assert "holes.jsonl row 2: rejected must be non-empty text" in message


def test_pairs_from_a_finished_runs_rollouts(model_store: ModelStore, tmp_path: Path) -> None:
    """from_run: the worker's prepare_inputs writes a right vs a wrong rollout of each prompt as a
    pair (the dpo kind's fixture), and the kind trains and holds out on them."""
    config = rm_config({"from_run": 7, "eval_fraction": 0.25})
    rollouts_of = stand_in_rollouts(config)
    prepare_inputs(config, tmp_path, rollouts_of)
    written = [json.loads(line) for line in (tmp_path / PAIRS_FILE).read_text().splitlines()]
    stored = rollouts_of(7)
    assert len(written) == 4 == len({p for p, _, _ in stored})
    right = {(p, c) for p, c, r in stored if r == 1.0}
    assert all((w["prompt"], w["chosen"]) in right for w in written)
    assert all((w["prompt"], w["rejected"]) not in right for w in written)

    sink = MemorySink()
    result = train_job(config, sink, workdir=tmp_path, model_store=model_store)
    assert result.status == "succeeded"
    assert {"eval/rm_accuracy", "eval/rm_margin"} <= sink.steps[2].metrics.keys()


def test_a_run_whose_source_run_gave_no_pairs_is_refused(
    model_store: ModelStore, tmp_path: Path
) -> None:
    config = rm_config({"from_run": 7})
    prepare_inputs(config, tmp_path, lambda run: [("q", "a", 1.0), ("q", "b", 1.0)])
    with pytest.raises(ValueError, match="no preference pairs in run 7's stored rollouts"):
        train_job(config, MemorySink(), workdir=tmp_path, model_store=model_store)


def test_the_score_head_starts_from_the_seed_alone(arith_base: Path) -> None:
    def head(seed: int) -> torch.Tensor:
        torch.manual_seed(seed + 100)  # whatever the process's stream holds
        model, _ = load_pretrained(arith_base, CPU, torch.float32, head="sequence_score", seed=seed)
        score: Any = model.score
        return score.weight.detach().clone()

    assert torch.equal(head(1), head(1)) and not torch.equal(head(1), head(2))


@pytest.mark.parametrize("lora_rank", [4, 0], ids=["lora", "full"])
def test_a_resumed_run_continues_exactly(
    model_store: ModelStore, tmp_path: Path, lora_rank: int
) -> None:
    """The score head is in the checkpoint (LoRA: peft's modules_to_save beside the adapters):
    a run stopped after step 2 and resumed logs step 3 as the run that never stopped."""
    pairs = write_jsonl(tmp_path / "prefs.jsonl", arith_pairs(24))

    def config(steps: int) -> RunConfig:
        return rm_config(
            {"path": str(pairs), "batch_size": 4},
            steps=steps,
            model={"name": "tiny", "lora": {"rank": lora_rank}},
            optim={"lr": 1e-3},
            checkpoint={"every": 1},
        )

    whole = MemorySink()
    train_job(config(3), whole, workdir=tmp_path / "whole", model_store=model_store)
    train_job(config(2), MemorySink(), workdir=tmp_path / "resumed", model_store=model_store)
    resumed = MemorySink()
    train_job(config(3), resumed, workdir=tmp_path / "resumed", model_store=model_store)
    assert resumed.steps.keys() == {3}
    for key in ("optim/loss", "rm/margin", "eval/rm_margin"):
        assert resumed.steps[3].metrics[key] == pytest.approx(whole.steps[3].metrics[key], abs=1e-6)
