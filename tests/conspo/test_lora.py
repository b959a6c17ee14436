"""LoRA runs (model.lora.rank > 0): only the adapters train, the reference is the base with its
adapters off, checkpoints hold the adapters and resume exactly, and export merges them."""

from __future__ import annotations

import math
import warnings

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from conspo import metrics as M
from conspo.cli import main
from conspo.config import RunConfig
from conspo.generation.rollout import sample
from conspo.models.export import export_merged
from conspo.models.loading import load_pretrained
from conspo.sink import MemorySink
from conspo.training.logprobs import token_logprobs
from conspo.training.loop import setup
from conspo.training.trainer import train, train_step
from tests.conspo.test_resume import comparable


def config(steps: int = 4, **overrides) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": steps,
        "seed": 5,
        "params": {"beta": 0.1},
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 8},
        "model": {"name": "tiny-arith", "lora": {"rank": 4, "alpha": 8}},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "optim": {"lr": 1e-2, "mini_batches": 2, "micro_batch_tokens": 40},
        "eval": {"every": 2, "pass_k": 1},
        "checkpoint": {"every": 0, "keep": 1},
        **overrides,
    })  # fmt: skip


def test_only_the_adapters_train_and_the_reference_is_the_base(model_store, arith_base):
    state = setup(config(optim={"lr": 1e-2, "micro_batch_tokens": 40}), model_store)
    assert isinstance(state.model, PeftModel) and state.ref_model is None
    names = {n for n, p in state.model.named_parameters() if p.requires_grad}
    assert names and all("lora_" in n for n in names)
    assert len(state.optimizer.param_groups[0]["params"]) == len(names)
    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    records = [train_step(state, step, lambda: False) for step in (1, 2)]
    for n, p in state.model.named_parameters():
        assert torch.equal(p, before[n]) == (n not in names), n
    # Step 1 starts at B = 0, so π_θ = π_ref; step 2 has moved away.
    assert records[0] is not None and records[1] is not None
    assert abs(records[0].metrics[M.KL]) < 1e-6 < records[1].metrics[M.KL]


def test_a_lora_run_sets_up_and_exports_without_a_future_warning(model_store, arith_base, tmp_path):
    """Issue 49: every LoRA run (SmolLM2's recommended settings among them) printed
    transformers' FutureWarning "`is_gradient_checkpointing` is deprecated" into its Logs tab:
    peft's PeftModel reads that old name. Setting up, a step, and the export's merge show none."""
    cfg = config(steps=1, model={"name": "tiny-arith", "lora": {"rank": 4},
                                 "gradient_checkpointing": True})  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        train(cfg, MemorySink(), workdir=tmp_path / "run", model_store=model_store)
        final = tmp_path / "run" / "checkpoints" / "step_000001"
        export_merged(final, arith_base, tmp_path / "merged")


def test_a_lora_run_resumes_exactly_and_exports_a_merged_model(model_store, arith_base, tmp_path):
    whole = MemorySink()
    train(config(), whole, workdir=tmp_path / "whole", model_store=model_store)
    first, second = MemorySink(), MemorySink()
    train(config(), first, lambda: max(first.steps, default=0) >= 2, workdir=tmp_path / "split",
          model_store=model_store)  # fmt: skip
    checkpoint = tmp_path / "split" / "checkpoints" / "step_000002"
    files = {p.name for p in checkpoint.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert not (checkpoint / "model.safetensors").exists()
    train(config(), second, workdir=tmp_path / "split", model_store=model_store)
    assert second.events[0][0] == "resumed" and second.events[0][1]["lora_rank"] == 4
    joined = MemorySink()
    joined.steps = {**first.steps, **second.steps}
    assert comparable(joined) == comparable(whole)
    assert all(math.isfinite(r.metrics[M.LOSS]) for s, r in whole.steps.items() if s > 0)

    final = tmp_path / "whole" / "checkpoints" / "step_000004"
    out = export_merged(final, None, tmp_path / "merged")  # the base as the checkpoint records
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    base, tok = load_pretrained(arith_base, torch.device("cpu"), torch.float32)
    adapted = PeftModel.from_pretrained(base, final).eval()
    ids = tok(["1+2-3=", "9-4+1="], return_tensors="pt", padding=True)
    batch = sample(adapted, ids.input_ids, ids.attention_mask, max_new_tokens=6,
                   eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        want, _ = token_logprobs(adapted, batch, 1.0)
        got, _ = token_logprobs(merged.eval(), batch, 1.0)
        plain, _ = token_logprobs(AutoModelForCausalLM.from_pretrained(arith_base), batch, 1.0)
    m = batch.response_mask.bool()
    torch.testing.assert_close(got[m], want[m], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain[m], want[m], atol=1e-3)  # the adapters did change the policy

    assert main(["export", str(final), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "config.json").exists()
    assert main(["export", str(final), "--out", str(tmp_path / "cli")]) == 2  # exists already


def test_a_full_fine_tuning_checkpoint_exports_as_is(model_store, arith_base, tmp_path):
    cfg = config(steps=1, model={"name": "tiny-arith"}, params={}, optim={"lr": 1e-3})
    train(cfg, MemorySink(), workdir=tmp_path / "run", model_store=model_store)
    final = tmp_path / "run" / "checkpoints" / "step_000001"
    out = export_merged(final, None, tmp_path / "exported")
    assert not (out / "optimizer.pt").exists() and not (out / "trainer_state.pt").exists()
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(final).state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)


def test_old_and_new_logprobs_agree_before_the_first_update_despite_dropout(
    model_store, arith_base, tmp_path
):
    """A model saved with attention dropout 0.5: π_old (frozen before the first optimiser step)
    and π_θ of the first mini-batch are the same policy, so their log-probs agree."""
    model, tok = load_pretrained(arith_base, torch.device("cpu"), torch.float32)
    model.config.attention_dropout = 0.5
    model.save_pretrained(tmp_path / "dropout")
    tok.save_pretrained(tmp_path / "dropout")
    cfg = config(steps=1, model={"name": str(tmp_path / "dropout")}, params={},
                 optim={"mini_batches": 2})  # fmt: skip
    state = setup(cfg, model_store)
    seen = []
    objective = state.objective

    def spy(batch, params):
        seen.append((batch.logprobs.detach(), batch.old_logprobs, batch.mask.bool()))
        return objective(batch, params)

    state.objective = spy
    train_step(state, 1, lambda: False)
    new, old, mask = seen[0]
    torch.testing.assert_close(new[mask], old[mask], atol=1e-5, rtol=1e-5)
