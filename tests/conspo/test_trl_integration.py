"""ConSPOTrainer (conspo.integrations.trl): parity with conspo.objectives / conspo.training.stats on
one TRL batch, whole groups through TRL's shuffle, and the refusals.

Parity: TRL generates and scores one batch; the subclass's loss and gradients on it are compared
with the registered objective on a PolicyBatch built here independently (our own forward pass,
the reward function called on the decoded completions, group ids from the row order), and its
logged §4 statistics with ``conspo.training.stats.separation_stats`` on the same scores. Tolerances
(float32, same model, same tokens): loss rtol 1e-5 / atol 1e-6, gradients rtol 1e-4 /
atol 1e-6 (max over parameters), statistics rtol 1e-5 / atol 1e-6.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any, cast

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig

from conspo import metrics as M
from conspo.integrations.trl import GROUP_IDS, ConSPOTrainer, shuffle_groups
from conspo.models.tiny import build_char_tokenizer, build_tiny_model
from conspo.objectives.base import (
    PolicyBatch,
    clipped_ratio_scores,
    clipped_surrogate,
    group_advantages,
    sequence_scores,
)
from conspo.objectives.reinforce_pp import reinforce_pp_advantages
from conspo.registry import get_objective
from conspo.training.stats import separation_stats

G = 4
PROMPTS = ["1+2=", "7-3=", "12+34=", "9-8="]


def parity_reward(completions: list[str], **_: object) -> list[float]:
    """0/1 from the characters (deterministic, mixes groups of a random tiny model)."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


def make_trainer(tmp_path, algorithm="conspo", params=None, **overrides) -> ConSPOTrainer:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    options = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=len(PROMPTS) * G,
        num_generations=G,
        max_completion_length=6,
        max_steps=3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        save_strategy="no",
        seed=0,
    )
    options.update(overrides)
    return ConSPOTrainer(
        model=model,
        reward_funcs=parity_reward,
        args=GRPOConfig(**options),
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 4]),
        processing_class=tokenizer,
        algorithm=algorithm,
        params=params,
    )


def reference_logprobs(model, inputs) -> torch.Tensor:
    """(B, T) log π_θ of the completion tokens by a plain forward (not TRL's helper)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    t = inputs["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -t - 1 : -1].float()
    logp = logits.log_softmax(-1)
    return logp.gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)


def grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize(
    ("algorithm", "params", "off_policy"),
    [("conspo", {"margin": "fixed"}, False), ("grpo", {}, True)],
)
def test_loss_gradients_and_statistics_equal_conspo_on_the_same_batch(
    tmp_path, algorithm, params, off_policy
):
    trainer = make_trainer(tmp_path, algorithm, params)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    rows = [{"prompt": p} for p in PROMPTS for _ in range(G)]  # TRL's order: G rows per prompt
    inputs = trainer._generate_and_score_completions(rows)
    if off_policy:  # a moved π_θ, so GRPO's ratio and clipping are exercised
        with torch.no_grad():
            noise = 0.3 * torch.randn(inputs["completion_ids"].shape)
            inputs["old_per_token_logps"] = reference_logprobs(model, inputs) + noise

    model.zero_grad()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    trl_grads = grads(model)

    # The same batch built by hand: our forward, the reward on the decoded text, groups by row.
    model.zero_grad()
    logprobs = reference_logprobs(model, inputs)
    mask = inputs["completion_mask"].float()
    texts = trainer.processing_class.batch_decode(
        inputs["completion_ids"], skip_special_tokens=True
    )
    rewards = torch.tensor(parity_reward(texts))
    assert 0 < rewards.sum() < len(rewards), "the batch needs positives and negatives"
    group_ids = torch.arange(len(rows)) // G
    entry = get_objective(algorithm)
    batch = PolicyBatch(
        logprobs=logprobs,
        mask=mask,
        rewards=rewards,
        group_ids=group_ids,
        progress=0.0,
        max_response_len=6,
        old_logprobs=inputs.get("old_per_token_logps"),
        correct=rewards,
    )
    out = entry.fn(batch, entry.params.model_validate(params))
    out.loss.backward()
    ours = grads(model)

    torch.testing.assert_close(loss, out.loss, rtol=1e-5, atol=1e-6)
    assert len(trl_grads) == len(ours) and any(g.abs().sum() > 0 for g in ours)
    for a, b in zip(trl_grads, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

    view = trainer.objective_params.separation_view(0.0)
    behaviour = logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs
    expected = separation_stats(
        sequence_scores(behaviour, mask),
        rewards,
        group_ids,
        mask.sum(-1),
        margin=view.margin,
        tau=view.tau,
        clipped_scores=clipped_ratio_scores(
            logprobs.detach(), batch.old_logprobs, mask, rewards, view.clip_eps
        ),
    )
    logged = trainer._metrics["train"]
    for key, value in expected.items():
        got, want = logged[key][-1], float(value)
        assert math.isnan(got) == math.isnan(want), key
        if not math.isnan(want):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6), key
    assert logged[M.BATCH_VALID_GROUPS][-1] + logged[M.BATCH_ALL_POS_GROUPS][-1] + logged[
        M.BATCH_ALL_NEG_GROUPS
    ][-1] == len(PROMPTS)


def test_groups_stay_whole_through_the_shuffle_and_split(tmp_path):
    trainer = make_trainer(tmp_path, per_device_train_batch_size=2 * G, steps_per_generation=2)
    trainer.model.train()
    torch.manual_seed(1)
    rows = [{"prompt": p} for p in PROMPTS for _ in range(G)]
    trainer._step = 0
    first = trainer._prepare_inputs(rows)
    trainer._step = 1
    second = trainer._prepare_inputs(rows)
    seen = torch.cat([first[GROUP_IDS], second[GROUP_IDS]])
    assert sorted(seen.tolist()) == sorted((torch.arange(len(rows)) // G).tolist())
    for micro in (first, second):
        ids = micro[GROUP_IDS]
        assert len(ids) == 2 * G and all((ids.view(-1, G) == ids.view(-1, G)[:, :1]).all(1))
    batch = {"x": torch.arange(12), "names": list("abcdefghijkl"), "n": torch.tensor(3)}
    shuffled = shuffle_groups(batch, 3)
    assert shuffled["n"] == 3 and sorted(shuffled["x"].tolist()) == list(range(12))
    assert (shuffled["x"].view(4, 3) - shuffled["x"].view(4, 3)[:, :1] == torch.arange(3)).all()
    assert shuffled["names"] == ["abcdefghijkl"[i] for i in shuffled["x"].tolist()]


WHOLE_BATCH_CASES = [
    ("reinforce_pp", {}),
    ("reinforce_pp", {"baseline": "group_mean"}),
    ("grpo", {"scale_rewards": "batch"}),
]


def check_whole_batch_normalisers(trainer: ConSPOTrainer, prompts: list[str]) -> None:
    """Train-mode ``compute_loss`` on each micro-batch of one generation batch of this process's
    ``prompts``; assert that every micro-batch's advantages and loss are those of the objective's
    batch normaliser on the whole generation batch at once (every process's rollouts)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    seen: list[PolicyBatch] = []
    objective = trainer.objective_fn
    trainer.objective_fn = lambda batch, p: seen.append(batch) or objective(batch, p)
    torch.manual_seed(0)
    rows = [{"prompt": p} for p in prompts for _ in range(G)]  # TRL's order: G rows per prompt
    losses = []
    for step in range(trainer._per_generation):
        trainer._step = step
        losses.append(trainer.compute_loss(trainer.model, trainer._prepare_inputs(rows)).detach())

    # Every rollout of every process once; sorted by group id, that is TRL's row order.
    acc, width = trainer.accelerator, trainer.max_completion_length
    masks = [torch.nn.functional.pad(b.mask, (0, width - b.mask.shape[1])) for b in seen]
    local = {
        "rewards": torch.cat([b.rewards for b in seen]),
        "groups": torch.cat([b.group_ids for b in seen]),
        "mask": torch.cat(masks),
    }
    every = {k: acc.gather(v) for k, v in local.items()}
    order = torch.sort(every["groups"], stable=True).indices
    groups, rewards = every["groups"][order], every["rewards"][order]
    assert groups.tolist() == (torch.arange(len(groups)) // G).tolist()
    assert rewards.std() > 0, "the batch needs mixed rewards"
    assert len(groups) == len(rows) * acc.num_processes > len(seen[0].rewards)
    algorithm = trainer.algorithm
    p = cast(Any, trainer.objective_params)
    if algorithm == "reinforce_pp":  # the whole batch at once (whole=None: this is all of it)
        at_once = reinforce_pp_advantages(
            rewards, groups, every["mask"][order], p.baseline, p.normalize
        )
    else:
        at_once = group_advantages(rewards, groups, "batch")
    expected = torch.empty_like(at_once)
    expected[order] = at_once  # back in the gathered micro-batches' order
    start = acc.process_index * len(local["rewards"])  # this process's rows of the gather
    for batch, loss in zip(seen, losses, strict=True):
        n = len(batch.rewards)
        adv = expected[start : start + n]
        start += n
        if algorithm == "reinforce_pp":  # what the objective whitened this micro-batch with
            got = reinforce_pp_advantages(
                batch.rewards, batch.group_ids, batch.mask, p.baseline, p.normalize, batch.whole
            )
            want, _ = clipped_surrogate(batch, adv, p.clip_low, p.clip_high, p.loss_agg)
        else:  # one pass: ρ = 1, so GRPO's loss is −mean_i Â_i
            got = group_advantages(
                batch.rewards, batch.group_ids, "batch", batch_std=batch.batch_reward_std
            )
            want = -adv.mean()
        torch.testing.assert_close(got, adv, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("algorithm", "params"), WHOLE_BATCH_CASES)
def test_batch_normalisers_span_the_whole_generation_batch(tmp_path, algorithm, params):
    """A generation batch of 4 groups in 2 micro-batches: REINFORCE++ whitens (GRPO's
    scale_rewards=batch divides) over all 16 rollouts, as the objective on the whole batch at
    once does, not over each micro-batch's 8 (issue 32)."""
    trainer = make_trainer(
        tmp_path, algorithm, params, per_device_train_batch_size=2 * G, steps_per_generation=2
    )
    check_whole_batch_normalisers(trainer, PROMPTS)


@pytest.mark.slow
def test_two_processes_normalise_over_both_processes_rollouts():
    """The same with two processes (torchrun, gloo), each 4 groups in 2 micro-batches: the
    normalisers span all 8 groups of both processes (this file's __main__ is the worker)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [*launch, "2", __file__], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("whole batch of 2 processes") == len(WHOLE_BATCH_CASES)


def test_refusals_name_what_to_change(tmp_path):
    with pytest.raises(ValueError, match="multiple of num_generations"):
        make_trainer(tmp_path, per_device_train_batch_size=6, steps_per_generation=2)
    with pytest.raises(ValueError, match="unknown algorithm 'nope'; valid algorithms: .*conspo"):
        make_trainer(tmp_path, algorithm="nope")
    with pytest.raises(ValueError, match="GRPOConfig.beta"):
        make_trainer(tmp_path, params={"beta": 0.1})
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        make_trainer(tmp_path, top_entropy_quantile=0.5)


if __name__ == "__main__":  # a worker of test_two_processes_normalise_over_both_processes_rollouts
    import tempfile

    more = [*PROMPTS, "5+5=", "3-1=", "20+2=", "8-6="]
    for name, options in WHOLE_BATCH_CASES:
        with tempfile.TemporaryDirectory() as out:
            trl = make_trainer(
                out, name, options, per_device_train_batch_size=2 * G, steps_per_generation=2
            )
            world, rank = trl.accelerator.num_processes, trl.accelerator.process_index
            mine = more[rank * len(more) // world : (rank + 1) * len(more) // world]
            check_whole_batch_normalisers(trl, mine)
            if trl.accelerator.is_main_process:
                print(f"{name} {options}: whole batch of {world} processes", flush=True)
