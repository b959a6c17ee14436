"""An RL step whose rollouts call the python tool, on the real SmolLM2-135M-Instruct + LoRA: the
trainer samples through the tool engine, the verifier reads the model's answer after the
interpreter's output, the update trains on the model's tokens, the length reward and the stored
sample's length count the model's tokens as len/* does, and the step logs its tool use.

The prompts are a user's own file (the jsonl task) already in SmolLM2's chat format, two solved
turns before the question: shown the format, the model calls the tool most of the time."""

from __future__ import annotations

import json
import math
from statistics import mean

import pytest
import torch

from conspo.config import RunConfig
from conspo.models.loading import load_pretrained
from conspo.sandbox import sandbox_available
from conspo.sink import MemorySink
from conspo.training.trainer import train
from tests.support import REQUIRE_SERVICES, product_demos, tool_demo_chat

pytestmark = pytest.mark.skipif(
    not REQUIRE_SERVICES and not sandbox_available(),
    reason=f"no sandbox here: {sandbox_available().reason}",
)

MAX_NEW_TOKENS = 40
BUFFER = MAX_NEW_TOKENS - 1  # the penalty zone: the whole response


def test_an_rl_step_with_the_python_tool_trains_on_the_model_tokens(model_store, tmp_path) -> None:
    base = model_store.resolve("smollm2-135m-instruct")
    _, tokenizer = load_pretrained(base, torch.device("cpu"), torch.float32)
    pairs = [(123 + 7 * i, 45 + 3 * i) for i in range(12)]
    rows = [
        {
            "prompt": tool_demo_chat(tokenizer, product_demos(), f"What is {a} * {b}?"),
            "answer": str(a * b),
        }
        for a, b in pairs
    ]
    path = tmp_path / "products.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = RunConfig.model_validate({
        "algorithm": "grpo",
        "steps": 1,
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": {"rank": 4}},
        "task": {"name": "jsonl", "params": {"path": str(path)}, "eval_size": 2},
        "prompt": {"chat_template": "off"},
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": MAX_NEW_TOKENS},
        "tools": {"names": ["python"], "timeout_s": 5},
        # DAPO's overlong penalty over the whole response: −(length − 1) / 39, linear in it
        "rewards": [{"name": "length", "weight": 0.01, "params": {"buffer": BUFFER}}],
        "optim": {"lr": 1e-3},
        "eval": {"every": 0, "at_start": False, "pass_k": 1},
        "checkpoint": {"every": 0},
        "logging": {"rollout_sample": 8},
    })  # fmt: skip
    sink = MemorySink()
    result = train(cfg, sink, workdir=tmp_path / "run", model_store=model_store)
    assert result.status == "succeeded"
    record = sink.steps[1]
    m = record.metrics
    assert m["tools/calls"] > 0 and m["tools/ok_rate"] > 0
    # Calls run beside generation, so what they held it up (time/tools_s) may be zero; the
    # sandbox's busy time cannot be.
    assert m["time/sandbox_s"] > 0 and m["time/tools_s"] >= 0
    assert m["tools/observation_tokens"] > 0 and m["tools/turns"] == 1 + m["tools/calls"]
    assert math.isfinite(m["optim/loss"]) and m["optim/updates"] >= 0
    assert 0 <= m["eval/tool_call_rate"] <= 1 and "eval/accuracy" in m
    # The sampled rollouts carry the interpreter's real output, and a correct one's answer
    # is the product the interpreter printed (the verifier read the model's text after it).
    shown = [r for r in record.rollouts if "<interpreter>" in r.completion]
    assert shown, "no sampled rollout called the tool"
    products = {str(a * b) for a, b in pairs}
    for r in shown:
        printed = r.completion.split("<interpreter>\n", 1)[1].split("\n", 1)[0]
        if printed in products and r.reward == 1.0:
            assert printed in r.completion.rsplit("</interpreter>", 1)[1]
    # The length reward, the stored sample's length and len/* all count the model's own
    # tokens: the interpreter's are no part of it (every rollout is in the sample here).
    assert len(record.rollouts) == 8 and m["tools/observation_tokens"] > 0
    for correct, key in ((1.0, "len/pos"), (0.0, "len/neg")):
        lengths = [r.length for r in record.rollouts if r.reward == correct]
        assert math.isnan(m[key]) if not lengths else m[key] == pytest.approx(mean(lengths))
    lengths = [r.length for r in record.rollouts]
    expected = mean(-min(max(n - (MAX_NEW_TOKENS - BUFFER), 0) / BUFFER, 1.0) for n in lengths)
    assert m["reward/length"] == pytest.approx(expected)
