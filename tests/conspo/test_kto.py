"""The ``kto`` job kind (conspo/jobs/kto.py, docs/objectives.md §8.2): the loss and its reference
point against a hand computation, no gradient through z_0, one step of the kind on the tiny model
raising its desirable completions and lowering its undesirable ones, the examples from a labels
file, a pairs file and a finished run's rollouts, and each bad source refused by what is wrong."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from conspo import metrics as M
from conspo.access import DataFiles, ModelSources
from conspo.config import RunConfig
from conspo.jobs import prepare_inputs, train_job
from conspo.jobs.kto import KTOParams, kto_loss, start
from conspo.jobs.preferences import EXAMPLES_FILE, Labelled, load_labelled
from conspo.models.resources import estimate_memory, source_dims, supervised_rows
from conspo.models.store import ModelStore
from conspo.sink import MemorySink
from conspo.tasks import make_task
from conspo.training.logprobs import sequence_logprobs
from conspo.training.loop import setup
from conspo.training.sft import answer_rows

CPU = torch.device("cpu")


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def write_jsonl(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def kto_config(kind_params: dict[str, object], **extra: object) -> RunConfig:
    return RunConfig.model_validate({
        "kind": "kto", "kind_params": kind_params, "steps": 2,
        "model": {"name": "tiny"}, "task": {"name": "arith", "eval_size": 2},
        "eval": {"every": 0, "pass_k": 1}, "checkpoint": {"every": 0}, **extra,
    })  # fmt: skip


# --- the loss -------------------------------------------------------------------------------


def test_the_loss_and_reference_point_are_ktos_worked_by_hand() -> None:
    """β = 0.5, λ_D = 1.5, λ_U = 1; four examples, desirable, undesirable, desirable,
    undesirable; mismatched log-ratios 0.3, −0.1, 0.6, 0.4: z_0 = max(0, 1.2 / 4) = 0.3."""
    ratio = torch.tensor([0.5, -1.0, 2.0, 0.2], requires_grad=True)
    mismatched = torch.tensor([0.3, -0.1, 0.6, 0.4], requires_grad=True)
    desirable = torch.tensor([True, False, True, False])
    loss, z0 = kto_loss(ratio, mismatched, desirable, 0.5, 1.5, 1.0)
    assert z0.item() == pytest.approx(0.3)
    # v: 1.5·σ(0.5·(0.5 − 0.3)), σ(0.5·(0.3 + 1)), 1.5·σ(0.5·(2 − 0.3)), σ(0.5·(0.3 − 0.2))
    s = [sigmoid(0.1), sigmoid(0.65), sigmoid(0.85), sigmoid(0.05)]
    expected = ((1.5 - 1.5 * s[0]) + (1 - s[1]) + (1.5 - 1.5 * s[2]) + (1 - s[3])) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-6)

    loss.backward()
    # dL/dr: −λ_D·β·σ(1 − σ)/B for a desirable one (its log-prob pushed up), +λ_U·β·σ(1 − σ)/B
    # for an undesirable one (pushed down)
    grad = [
        -1.5 * 0.5 * s[0] * (1 - s[0]) / 4,
        0.5 * s[1] * (1 - s[1]) / 4,
        -1.5 * 0.5 * s[2] * (1 - s[2]) / 4,
        0.5 * s[3] * (1 - s[3]) / 4,
    ]
    assert ratio.grad is not None
    assert ratio.grad.tolist() == pytest.approx(grad, rel=1e-5)
    assert mismatched.grad is None  # z_0 is detached: nothing flows into the mismatched pairs


def test_the_reference_point_is_floored_at_zero_and_weights_scale_each_side() -> None:
    """Mismatched pairs the policy finds likelier than the reference does not make z_0
    negative: mean(−0.4, −0.2) < 0 gives z_0 = 0. With z_0 = 0 and r = 0 every σ is ½, so the
    loss is the weights' mean over the batch halved."""
    ratio, mismatched = torch.zeros(3), torch.tensor([-0.4, -0.2])
    desirable = torch.tensor([True, True, False])
    loss, z0 = kto_loss(ratio, mismatched, desirable, 0.1, 2.0, 3.0)
    assert z0.item() == 0.0
    assert loss.item() == pytest.approx((2.0 / 2 + 2.0 / 2 + 3.0 / 2) / 3)


# --- one step of the kind on the tiny model ---------------------------------------------------


def test_one_step_raises_desirable_completions_and_lowers_undesirable_ones(
    model_store: ModelStore, tmp_path: Path
) -> None:
    rows = [
        {"prompt": "2+3=", "completion": "5", "label": True},
        {"prompt": "4+4=", "completion": "8", "label": True},
        {"prompt": "2+3=", "completion": "9", "label": False},
        {"prompt": "4+4=", "completion": "1", "label": False},
        {"prompt": "6-1=", "completion": "3", "label": False},
    ]
    labels = write_jsonl(tmp_path / "labels.jsonl", rows)
    config = kto_config(
        {"path": str(labels), "batch_size": 16}, optim={"lr": 1e-4, "warmup_steps": 0}
    )
    state = setup(config, model_store, DataFiles())
    update = start(state, DataFiles(), model_store, tmp_path)
    ids, mask, scored = answer_rows(
        state.tokenizer, [(r["prompt"], r["completion"]) for r in rows], CPU
    )

    def logprobs() -> torch.Tensor:
        with torch.no_grad():
            return sequence_logprobs(state.model.eval(), ids, mask, scored)[0]

    before = logprobs()
    metrics = update(1)
    moved = logprobs() - before
    assert moved[:2].min() > 0, moved  # each desirable completion likelier
    # the undesirable ones less likely together (not each: one shares its prompt with a
    # desirable completion whose rise it partly follows)
    assert moved[2:].sum() < 0, moved
    # π_θ = π_ref at the first step: every r_θ and z_0 are 0, every σ ½
    assert metrics[M.KTO_KL] == 0.0
    assert metrics[M.LOSS] == pytest.approx(0.5)
    assert metrics[M.KTO_REWARD_DESIRABLE] == 0.0 == metrics[M.KTO_REWARD_UNDESIRABLE]
    # 16 draws of 2 desirable and 3 undesirable examples: the logged ratio is the batch's
    assert 0 < metrics[M.KTO_WEIGHT_RATIO] < math.inf

    second = update(2)  # π_θ has moved: the sides part around z_0
    assert second[M.KTO_REWARD_DESIRABLE] > 0 > second[M.KTO_REWARD_UNDESIRABLE]
    assert second[M.KTO_ACCURACY] == 1.0
    assert second[M.LOSS] < metrics[M.LOSS]


def test_the_weight_ratio_is_the_batchs_and_infinite_without_an_undesirable_one(
    model_store: ModelStore, tmp_path: Path
) -> None:
    """λ_D·n_D / (λ_U·n_U) of each step's draw: with one undesirable example among many
    desirable ones a batch of 2 often draws none (the ratio is then infinite, a gap on the
    page); the finite ones are λ_D/λ_U times a ratio of counts."""
    rows = [{"prompt": f"{i}+0=", "completion": str(i), "label": True} for i in range(9)]
    rows.append({"prompt": "1+1=", "completion": "3", "label": False})
    labels = write_jsonl(tmp_path / "labels.jsonl", rows)
    params = {"path": str(labels), "batch_size": 2, "desirable_weight": 0.5}
    config = kto_config(params, optim={"lr": 1e-4, "warmup_steps": 0})
    state = setup(config, model_store, DataFiles())
    update = start(state, DataFiles(), model_store, tmp_path)
    ratios = [update(step)[M.KTO_WEIGHT_RATIO] for step in range(1, 9)]
    assert math.inf in ratios
    assert all(r in (math.inf, 0.5 * 1 / 1, 0.0) for r in ratios), ratios


# --- the examples and their sources ----------------------------------------------------------


def load(params: KTOParams, workdir: Path) -> list[Labelled]:
    return load_labelled(params, DataFiles(), workdir, lambda q: f"Q: {q}")


def test_a_labels_file_a_pairs_file_and_integer_labels(tmp_path: Path) -> None:
    labels = write_jsonl(tmp_path / "labels.jsonl", [
        {"prompt": "1+1=", "completion": "2", "label": True},
        {"prompt": "1+1=", "completion": "3", "label": False},
        {"prompt": "2+2=", "completion": "4", "label": True},
    ])  # fmt: skip
    assert load(KTOParams(path=str(labels)), tmp_path) == [
        Labelled("Q: 1+1=", "2", True),
        Labelled("Q: 1+1=", "3", False),
        Labelled("Q: 2+2=", "4", True),
    ]
    # a DPO pairs file: each pair a desirable and an undesirable example
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
    ])  # fmt: skip
    assert load(KTOParams(path=str(pairs)), tmp_path) == [
        Labelled("Q: 1+1=", "2", True),
        Labelled("Q: 1+1=", "3", False),
        Labelled("Q: 2+2=", "4", True),
        Labelled("Q: 2+2=", "5", False),
    ]
    # a table whose label is an integer column, 1 or 0
    table = tmp_path / "labels.parquet"
    Dataset.from_dict(
        {"prompt": ["1+1=", "1+1="], "completion": ["2", "3"], "label": [1, 0]}
    ).to_parquet(str(table))
    assert [e.desirable for e in load(KTOParams(path=str(table)), tmp_path)] == [True, False]


def test_examples_from_a_finished_runs_rollouts(model_store: ModelStore, tmp_path: Path) -> None:
    """from_run: the worker's prepare_inputs labels each stored rollout by its reward (correct:
    desirable), distinct per prompt and side, at most max_per_prompt of each; unbalanced sides
    and a prompt with one side only are kept; the kind trains on them."""
    config = kto_config({"from_run": 7, "max_per_prompt": 2})
    stored = [
        ("p1", "right", 1.0), ("p1", "right", 1.0), ("p1", "also right", 1.0),
        ("p1", "third right", 1.0), ("p1", "wrong", 0.0), ("p1", "wrong", 0.0),
        ("p2", "wrong a", 0.0), ("p2", "wrong b", None), ("p2", "wrong c", 0.0),
        ("p3", "only right", 1.0),
    ]  # fmt: skip
    prepare_inputs(config, tmp_path, lambda run: stored if run == 7 else [])
    written = [json.loads(line) for line in (tmp_path / EXAMPLES_FILE).read_text().splitlines()]
    assert [(w["prompt"], w["completion"], w["desirable"]) for w in written] == [
        ("p1", "right", True), ("p1", "also right", True), ("p1", "wrong", False),
        ("p2", "wrong a", False), ("p2", "wrong b", False), ("p3", "only right", True),
    ]  # fmt: skip
    # prompts stay the text the policy saw: not rendered again
    assert load(config.typed("kind_params", KTOParams), tmp_path)[0].prompt == "p1"

    task = make_task(config.task)
    problems = task.train_prompts(random.Random(0), 3)
    rollouts = [(ex.prompt, ex.answer, 1.0) for ex in problems] + [
        (ex.prompt, f"{ex.answer}1", 0.0) for ex in problems[:1]
    ]  # 3 desirable, 1 undesirable
    workdir = tmp_path / "run"
    workdir.mkdir()
    prepare_inputs(config, workdir, lambda run: rollouts)
    sink = MemorySink()
    result = train_job(config, sink, workdir=workdir, model_store=model_store)
    assert result.status == "succeeded"
    assert {M.KTO_KL, M.KTO_ACCURACY, M.KTO_WEIGHT_RATIO} <= sink.steps[2].metrics.keys()


def refusal(params: KTOParams, workdir: Path) -> str:
    with pytest.raises(ValueError) as caught:
        load(params, workdir)
    return str(caught.value)


def test_bad_sources_are_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    def file(name: str, rows: list[dict[str, object]]) -> KTOParams:
        return KTOParams(path=str(write_jsonl(tmp_path / name, rows)))

    message = refusal(file("nolabel.jsonl", [{"prompt": "1+1=", "completion": "2"}]), tmp_path)
    assert "kind_params.path" in message and "nolabel.jsonl" in message
    assert "['label']" in message and "prompt, chosen, rejected" in message
    message = refusal(
        file("halfpairs.jsonl", [{"prompt": "1+1=", "chosen": "2"}]), tmp_path
    )  # neither a labels file nor a pairs file
    assert "['completion', 'label']" in message
    one_sided = [{"prompt": "1+1=", "completion": c, "label": True} for c in ("2", "two")]
    message = refusal(file("good.jsonl", one_sided), tmp_path)
    assert "kind_params.path: " in message and "good.jsonl" in message
    assert "no undesirable example" in message and "label false" in message
    no_good = [{"prompt": "1+1=", "completion": "3", "label": False}]
    assert "no desirable example" in refusal(file("bad.jsonl", no_good), tmp_path)
    odd_label = [
        {"prompt": "1+1=", "completion": "2", "label": True},
        {"prompt": "1+1=", "completion": "3", "label": "nope"},
    ]
    message = refusal(file("odd.jsonl", odd_label), tmp_path)
    assert "odd.jsonl row 2: label must be true or false" in message
    empty_text = [{"prompt": "1+1=", "completion": "", "label": True}]
    assert "row 1: completion must be non-empty text" in refusal(
        file("empty.jsonl", empty_text), tmp_path
    )
    # a run whose rollouts were all right: nothing to push down
    params = KTOParams(from_run=3)
    config = kto_config({"from_run": 3})
    prepare_inputs(config, tmp_path, lambda run: [("q", "a", 1.0), ("q", "b", 1.0)])
    message = refusal(params, tmp_path)
    assert "kind_params.from_run: run 3's stored rollouts holds no undesirable" in message
    assert "were not prepared" in refusal(KTOParams(from_run=4), tmp_path / "elsewhere")


def test_params_are_refused_at_the_field() -> None:
    from pydantic import ValidationError

    def error(**params: object) -> str:
        with pytest.raises(ValidationError) as caught:
            KTOParams.model_validate(params)
        return str(caught.value)

    assert "exactly one of path (a labelled or pairs dataset) and from_run" in error()
    assert "exactly one of path" in error(path="x.jsonl", from_run=1)
    assert "batch_size" in error(from_run=1, batch_size=1)  # z_0 needs another completion
    assert "desirable_weight" in error(from_run=1, desirable_weight=0)
    assert "max_pairs_per_prompt" in error(from_run=1, max_pairs_per_prompt=2)  # dpo's field


def test_a_step_is_sized_as_its_completions_scored_by_the_reference_too() -> None:
    """The memory estimate: B completions with a reference forward, as a DPO step of B/2 pairs
    (the mismatched rows' no-grad forwards end before the update's begins)."""
    dims = source_dims(ModelSources().locate("tiny"))
    assert dims is not None

    def estimate(kind: str, batch: int):  # type: ignore[no-untyped-def]
        config = RunConfig.model_validate({
            "kind": kind, "kind_params": {"from_run": 1, "batch_size": batch},
            "model": {"name": "tiny"}, "sampling": {"max_new_tokens": 16},
        })  # fmt: skip
        return supervised_rows(config), estimate_memory(config, dims, 4)

    (kto_rows, kto), (dpo_rows, dpo) = estimate("kto", 8), estimate("dpo", 4)
    assert kto_rows == dpo_rows == (8, True)
    assert kto.update == dpo.update and kto.state == dpo.state
