"""Rollouts that call tools, on the real SmolLM2-135M-Instruct: generation pauses at a call,
the call runs, its output is fed back as tokens the model did not write, and the KV cache is
extended rather than recomputed. SmolLM2 does not call tools by itself; shown the format twice
in its chat, it does (greedy), which is all these tests need of it."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from conspo import stopping
from conspo.config import ToolsConfig
from conspo.generation.batch import SampleRequest
from conspo.generation.engines import HfEngine, NativeEngine
from conspo.generation.rollout import encode_prompts, end_token_ids
from conspo.generation.tool_rollout import ToolUse, sample_with_tools, verified_texts
from conspo.models.loading import load_pretrained
from conspo.sandbox import sandbox_available
from conspo.tools import OBSERVATION_OPEN, make_toolbox
from tests.support import REQUIRE_SERVICES, product_demos, tool_demo_chat

pytestmark = pytest.mark.skipif(
    not REQUIRE_SERVICES and not sandbox_available(),
    reason=f"no sandbox here: {sandbox_available().reason}",
)

DEMO = product_demos()
QUESTIONS = ["What is 1234 * 5678?", "What is 999 * 123?", "What is 4321 + 8765?"]


@pytest.fixture(scope="module")
def smollm2(model_store):
    model, tokenizer = load_pretrained(
        model_store.resolve("smollm2-135m-instruct"), torch.device("cpu"), torch.float32
    )
    return model.eval(), tokenizer


def prompts(tokenizer, questions, demo=DEMO, copies=1):
    """Left-padded chat prompts: ``demo`` as (question, code, printed, answer) turns
    (``tool_demo_chat``), or as chat messages for a demo with two calls in one answer."""

    def chat(question):
        if isinstance(demo[0], tuple):
            return tool_demo_chat(tokenizer, demo, question)
        turns = [*demo, {"role": "user", "content": question}]
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

    texts = [chat(q) for q in questions for _ in range(copies)]
    return encode_prompts(tokenizer, texts, torch.device("cpu"))


def request(model, tokenizer, max_new_tokens=64, temperature=0.0, seed=0, group_size=1):
    return SampleRequest(
        max_new_tokens=max_new_tokens,
        eos_id=end_token_ids(tokenizer, model),
        pad_id=tokenizer.pad_token_id,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
        group_size=group_size,
    )


def use(tokenizer, **tools):
    return ToolUse(make_toolbox(ToolsConfig(**{"names": ["python"], **tools})), tokenizer)


def texts(tokenizer, batch):
    return tokenizer.batch_decode(batch.response_ids.tolist(), skip_special_tokens=True)


def test_a_call_pauses_the_rollout_and_its_real_output_comes_back_masked(smollm2) -> None:
    model, tok = smollm2
    ids, mask = prompts(tok, QUESTIONS)
    batch = sample_with_tools(model, ids, mask, request(model, tok), use(tok))
    assert [len(calls) for calls in batch.tool_calls] == [1, 1, 1]
    assert all(call.status == "ok" for calls in batch.tool_calls for call in calls)
    full = texts(tok, batch)
    # the interpreter's real output: nothing the model could have copied from its prompt
    assert "<interpreter>\n7006652\n</interpreter>" in full[0]
    assert "<interpreter>\n122877\n</interpreter>" in full[1]
    assert "<interpreter>\n13086\n</interpreter>" in full[2]
    # exactly the appended tokens are observation tokens: decoding them gives the block
    for i, calls in enumerate(batch.tool_calls):
        seen = batch.observation_mask[i] > 0
        assert int(seen.sum()) == calls[0].observation_tokens
        block = tok.decode(batch.response_ids[i][seen].tolist())
        assert block.startswith("\n" + OBSERVATION_OPEN) and block.endswith("</interpreter>\n")
    assert torch.equal(batch.model_mask + batch.observation_mask, batch.response_mask)
    assert torch.equal(batch.model_lengths + batch.observation_mask.sum(-1).long(), batch.lengths)
    # the verifier reads the model's answer after the output, never the interpreter's text
    answers = verified_texts(tok, batch)
    assert answers[0].strip() == "The answer is 7006652." and "<interpreter>" not in answers[0]


def test_the_extended_cache_gives_the_logits_of_one_forward_over_the_whole_sequence(
    smollm2,
) -> None:
    """Greedy tokens drawn on the extended KV cache are the argmax of a fresh forward over
    prompt + response (interpreter tokens included): the cache was extended, not corrupted,
    including where rows waited for their call and the columns were realigned."""
    model, tok = smollm2
    ids, mask = prompts(tok, [*QUESTIONS, "Hello! How are you?"])
    batch = sample_with_tools(model, ids, mask, request(model, tok), use(tok))
    assert batch.tool_calls[3] == [] and all(batch.tool_calls[:3])  # rows wait unevenly
    seq = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    attn = torch.cat([batch.prompt_mask, batch.response_mask.long()], 1)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=attn, position_ids=positions).logits
    p = batch.prompt_ids.shape[1]
    predicted = logits[:, p - 1 : -1].argmax(-1)  # (N, T) what each response position predicts
    written = batch.model_mask > 0
    assert int(written.sum()) > 60
    assert torch.equal(predicted[written], batch.response_ids[written])


def test_native_forward_and_hf_paths_draw_the_same_rollouts(smollm2) -> None:
    model, tok = smollm2
    ids, mask = prompts(tok, QUESTIONS[:2], copies=2)
    tools = use(tok)
    native = NativeEngine().sample_with_tools(model, ids, mask, request(model, tok), tools)
    plain = sample_with_tools(model, ids, mask, request(model, tok), tools, decode_loop=False)
    hf = HfEngine().sample_with_tools(model, ids, mask, request(model, tok), tools)
    for other in (plain, hf):
        assert texts(tok, other) == texts(tok, native)
        assert torch.equal(other.observation_mask, native.observation_mask)
    # Sampled at temperature 1 from one seed, the native loop and transformers' forward draw
    # the same tokens (the same logits to float rounding, the same noise).
    sampled = request(model, tok, temperature=1.0, seed=3, group_size=2)
    a = sample_with_tools(model, ids, mask, sampled, tools)
    sampled = request(model, tok, temperature=1.0, seed=3, group_size=2)
    b = sample_with_tools(model, ids, mask, sampled, tools, decode_loop=False)
    assert texts(tok, a) == texts(tok, b)


def test_calls_past_max_turns_are_left_as_text(smollm2) -> None:
    model, tok = smollm2
    demo = []
    for a, b, c in ((2, 3, 4), (5, 7, 2)):
        demo += [
            {"role": "user", "content": f"What is {a} * {b}, then add {c}?"},
            {
                "role": "assistant",
                "content": f"<code>\nprint({a} * {b})\n</code>\n<interpreter>\n{a * b}\n"
                f"</interpreter>\n<code>\nprint({a * b} + {c})\n</code>\n<interpreter>\n"
                f"{a * b + c}\n</interpreter>\nThe answer is {a * b + c}.",
            },
        ]
    ids, mask = prompts(tok, ["What is 17 * 3, then add 9?"], demo=demo)
    two = sample_with_tools(model, ids, mask, request(model, tok, 96), use(tok, max_turns=2))
    one = sample_with_tools(model, ids, mask, request(model, tok, 96), use(tok, max_turns=1))
    assert len(two.tool_calls[0]) == 2
    assert "<interpreter>\n51\n</interpreter>" in texts(tok, two)[0]
    assert "<interpreter>\n60\n</interpreter>" in texts(tok, two)[0]  # it read the first
    assert len(one.tool_calls[0]) == 1
    # the model's second call is there as it wrote it, and nothing ran it: the only tokens
    # the model did not write are the first call's output (what follows is the model's own,
    # an interpreter block it made up included)
    seen = one.observation_mask[0] > 0
    assert int(seen.sum()) == one.tool_calls[0][0].observation_tokens
    first = one.tool_calls[0][0].observation_tokens
    after = tok.decode(one.response_ids[0][int(seen.nonzero().max()) + 1 :].tolist())
    assert "<code>" in after and first > 0


def test_the_budget_counts_interpreter_tokens_and_cuts_an_observation(smollm2) -> None:
    model, tok = smollm2
    demo = [
        ("Print the numbers 1 to 3.", "for i in range(1, 4):\n    print(i)", "1\n2\n3", "Done.")
    ]
    ids, mask = prompts(tok, ["Print the numbers 1 to 300."], demo=demo)
    budget = 40
    batch = sample_with_tools(model, ids, mask, request(model, tok, budget), use(tok))
    (call,) = batch.tool_calls[0]
    assert int(batch.lengths[0]) == budget and bool(batch.truncated[0])
    assert call.observation_tokens == budget - int(batch.model_lengths[0])


def test_a_hostile_call_costs_its_own_timeout_and_the_other_rows_are_answered(smollm2) -> None:
    model, tok = smollm2
    demo = [
        ("Run: while True: pass", "while True:\n    pass", "TimeoutError", "It did not finish.")
    ]
    ids_a, mask_a = prompts(tok, ["Run: while True: pass"], demo=demo)
    ids_b, mask_b = prompts(tok, QUESTIONS[:1])
    width = max(ids_a.shape[1], ids_b.shape[1])
    pad = tok.pad_token_id

    def left(x, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    ids = torch.cat([left(ids_a, pad), left(ids_b, pad)])
    mask = torch.cat([left(mask_a, 0), left(mask_b, 0)])
    batch = sample_with_tools(model, ids, mask, request(model, tok, 80), use(tok, timeout_s=1))
    assert batch.tool_calls[0][0].status == "timeout"
    assert 1 <= batch.tool_calls[0][0].seconds < 10
    assert batch.tool_calls[1][0].status == "ok"
    assert "7006652" in verified_texts(tok, batch)[1]


def test_a_cancel_during_a_long_tool_call_ends_the_rollout_within_seconds(smollm2) -> None:
    """The run is abandoned (``conspo.stopping``) while its only row waits on a call that would
    run 30 s: the wait is cut in slices, so the rollout raises within a few seconds."""
    model, tok = smollm2
    demo = [("Run: while True: pass", "while True:\n    pass", "TimeoutError", "It did not end.")]
    ids, mask = prompts(tok, ["Run: while True: pass"], demo=demo)
    cancelled = threading.Event()
    threading.Timer(3.0, cancelled.set).start()
    started = time.monotonic()
    with pytest.raises(stopping.Abandoned), stopping.abandon_when(cancelled.is_set):
        sample_with_tools(model, ids, mask, request(model, tok, 80), use(tok, timeout_s=30))
    took = time.monotonic() - started
    assert cancelled.is_set() and took < 10, f"abandoned after {took:.1f} s"
