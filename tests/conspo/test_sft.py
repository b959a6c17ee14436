"""The supervised rows (conspo.training.sft): a target that holds the interpreter's blocks (a
tool-use trace, a rollout of a run with tools) is trained on the model's own text only, in the
SFT loss, its token count and accuracy, and in DPO's sequence log-probs.

A causal model's tokens after a block read it (that is what the block is for), so what the block
says changes their log-probs. What masking guarantees, and what is tested here, is that the
block's own tokens are never targets: the loss and its gradient are the same whatever the labels
hold at the block, and the logits there get no gradient. A change of the model's text changes
both.
"""

from __future__ import annotations

import pytest
import torch

from conspo.models.loading import load_pretrained
from conspo.tools import split_turns
from conspo.training.logprobs import sequence_logprobs
from conspo.training.sft import answer_loss, answer_rows, answer_tokens

CPU = torch.device("cpu")
PROMPT = "1663*5242="
CALL = "<calc>1663*5242</calc>"


def trace(output: str, answer: str = "8717446") -> str:
    return f"{CALL}\n<interpreter>\n{output}\n</interpreter>\n{answer}"


def rows(tok, text: str):  # type: ignore[no-untyped-def]
    return answer_rows(tok, [(PROMPT, text)], CPU)


@pytest.fixture(scope="module")
def policy(model_store):  # type: ignore[no-untyped-def]
    """The tiny model (random weights, one token per character): built in a second, and any
    weights tell a masked token from a scored one."""
    model, tok = load_pretrained(model_store.resolve("tiny"), CPU, torch.float32)
    return model.eval(), tok


def loss_and_grads(model, ids, mask, labels):  # type: ignore[no-untyped-def]
    model.zero_grad(set_to_none=True)
    loss, _, _ = answer_loss(model, ids, mask, labels)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return loss.detach(), grads


def test_the_interpreters_tokens_are_labelled_out_and_the_models_are_kept(policy) -> None:
    _, tok = policy
    text = trace("8717446")
    ids, labels = answer_tokens(tok, text)
    kept = tok.decode([i for i, label in zip(ids, labels, strict=True) if label != -100])
    dropped = tok.decode([i for i, label in zip(ids, labels, strict=True) if label == -100])
    assert kept == CALL + "8717446"
    assert dropped == "\n<interpreter>\n8717446\n</interpreter>\n"
    # the ids are the text's segments laid end to end, as a rollout holds them
    segments = [tok(s.text, add_special_tokens=False)["input_ids"] for s in split_turns(text)]
    assert ids == [i for part in segments for i in part]
    # a plain answer: every token labelled, as before traces existed
    plain_ids, plain_labels = answer_tokens(tok, "8717446")
    assert plain_labels == plain_ids == tok("8717446", add_special_tokens=False)["input_ids"]


def test_sft_loss_and_gradient_ignore_the_interpreters_text_but_not_the_models(policy) -> None:
    model, tok = policy
    model.train()
    ids, mask, labels = rows(tok, trace("12345"))
    other_ids, _, other_output = rows(tok, trace("67890"))  # same length (one token per digit)
    _, _, other_answer = rows(tok, trace("12345", answer="8717447"))
    assert other_output.shape == labels.shape and not torch.equal(other_ids, ids)
    loss, grads = loss_and_grads(model, ids, mask, labels)
    same, same_grads = loss_and_grads(model, ids, mask, other_output)
    moved, moved_grads = loss_and_grads(model, ids, mask, other_answer)
    assert torch.equal(loss, same)
    assert all(torch.equal(a, b) for a, b in zip(grads, same_grads, strict=True))
    assert not torch.isclose(loss, moved)
    assert any(not torch.equal(a, b) for a, b in zip(grads, moved_grads, strict=True))
    # unmasked (every answer token a target), the interpreter's text would count
    unmasked = torch.where(labels == -100, ids, labels)
    unmasked[:, : len(tok(PROMPT, add_special_tokens=False)["input_ids"])] = -100
    assert not torch.isclose(answer_loss(model, ids, mask, unmasked)[0], loss)
    model.eval()


def test_no_gradient_reaches_the_logits_at_the_interpreters_tokens(policy) -> None:
    model, tok = policy
    ids, mask, labels = rows(tok, trace("8717446"))
    seen: list[torch.Tensor] = []

    def keep(module, inputs, output):  # type: ignore[no-untyped-def]
        output.retain_grad()  # the model's own logits, their gradient kept to be read
        seen.append(output)

    hook = model.get_output_embeddings().register_forward_hook(keep)
    try:
        answer_loss(model, ids, mask, labels)[0].backward()
    finally:
        hook.remove()
        model.zero_grad(set_to_none=True)
    logits = seen[0]
    assert logits.grad is not None
    per_position = logits.grad[0, :-1].abs().sum(-1)  # position t predicts token t + 1
    target_is_model = labels[0, 1:] != -100
    observation = torch.zeros_like(target_is_model)
    prompt_len = len(tok(PROMPT, add_special_tokens=False)["input_ids"])
    call_len = len(tok(CALL, add_special_tokens=False)["input_ids"])
    block = tok("\n<interpreter>\n8717446\n</interpreter>\n", add_special_tokens=False)["input_ids"]
    start = prompt_len + call_len - 1  # the position that predicts the block's first token
    observation[start : start + len(block)] = True
    assert torch.all(per_position[observation] == 0)
    assert torch.all(per_position[target_is_model] > 0)
    assert not (observation & target_is_model).any()


def test_the_token_count_is_the_models_tokens_only(policy) -> None:
    model, tok = policy
    short = rows(tok, trace("1"))
    long = rows(tok, trace("1" * 60))
    longer_answer = rows(tok, trace("1", answer="87174460"))
    with torch.no_grad():
        _, _, n_short = answer_loss(model, *short)
        _, _, n_long = answer_loss(model, *long)
        _, _, n_answer = answer_loss(model, *longer_answer)
    model_tokens = len(tok(CALL + "8717446", add_special_tokens=False)["input_ids"]) + 1  # + EOS
    assert int(n_short) == int(n_long) == model_tokens
    assert int(n_answer) == model_tokens + 1


def test_dpo_log_probs_sum_the_models_tokens_only(policy) -> None:
    """DPO's per-response log-prob (``sequence_logprobs`` over ``answer_rows``, as the dpo kind
    scores chosen and rejected): the same whatever the labels hold at the interpreter's block,
    with its gradient; counted over the model's tokens; changed by the model's text."""
    model, tok = policy
    ids, mask, labels = rows(tok, trace("12345"))
    scored = []
    for text in (trace("12345"), trace("67890"), trace("12345", answer="8717447")):
        _, _, its_labels = rows(tok, text)  # the same length: one token per digit
        logp, count = sequence_logprobs(model, ids, mask, its_labels)  # the first text's inputs
        grads = torch.autograd.grad(logp.sum(), list(model.parameters()))
        scored.append((logp.detach(), int(count), grads))
    (logp, count, grads), (same, same_count, same_grads), (moved, _, moved_grads) = scored
    assert torch.equal(logp, same)
    assert all(torch.equal(a, b) for a, b in zip(grads, same_grads, strict=True))
    assert not torch.isclose(logp, moved)
    assert any(not torch.equal(a, b) for a, b in zip(grads, moved_grads, strict=True))
    model_tokens = len(tok(CALL + "8717446", add_special_tokens=False)["input_ids"]) + 1  # EOS
    assert count == same_count == model_tokens
