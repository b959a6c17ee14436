"""Supervised fine-tuning, once: the rows every supervised step trains on (``answer_rows``: the
``sft`` and ``dpo`` job kinds) and the warm start that makes the warm-started built-in models
(``warm_start``: `tiny-arith`, …, `tiny-chat-math`).

RL needs a policy that is right part of the time: a random model never earns a reward, and a
fully trained one leaves nothing to learn. A few hundred steps of cross-entropy on reference
answers (prompt tokens masked out) give a base that answers in the right format and is right on
a fraction of held-out problems. Training problems come from the task's training split only.

The warm start keeps its own schedule (linear warmup, cosine decay to 55%) rather than running
the ``sft`` job kind through ``conspo.training.loop``: the built-ins' weights are part of every
run trained from them, and their recipe changes only with ``STORE_VERSION``.

    python -m conspo sft --task arith --out DIR [--steps 600]
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from conspo import stopping
from conspo.config import TaskConfig
from conspo.models.loading import load_pretrained
from conspo.tasks import make_task
from conspo.tools import split_turns

# (prompt, answer) pairs: the text the model reads, and what it is taught to answer.
Pairs = list[tuple[str, str]]


def answer_rows(
    tokenizer: Any, pairs: Pairs, device: torch.device, max_tokens: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, L) ids, attention mask and labels of prompt + answer + EOS rows, labels
    -100 on the prompt, the padding and the interpreter's blocks inside the answer (the loss is
    on the tokens the model writes only: ``answer_tokens``).

    ``max_tokens`` > 0 packs consecutive examples into rows of at most that many tokens (an
    example longer than that gets a row of its own). Packed examples attend to the earlier ones
    of their row (plain concatenation, as TRL's packing without flash attention): fewer padding
    tokens, slightly leaked context. ``tokenizer``: a transformers tokenizer.
    """
    eos = tokenizer.eos_token_id
    seqs: list[tuple[list[int], list[int]]] = []
    for prompt, answer in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a, labels = answer_tokens(tokenizer, answer)
        seqs.append((p + a + [eos], [-100] * len(p) + labels + [eos]))
    rows: list[tuple[list[int], list[int]]] = []
    for ids, labels in seqs:
        if rows and max_tokens and len(rows[-1][0]) + len(ids) <= max_tokens:
            rows[-1] = (rows[-1][0] + ids, rows[-1][1] + labels)
        else:
            rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    out_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    out_labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, labels) in enumerate(rows):
        out_ids[i, : len(ids)] = torch.tensor(ids)
        out_labels[i, : len(ids)] = torch.tensor(labels)
        mask[i, : len(ids)] = 1
    return out_ids.to(device), mask.to(device), out_labels.to(device)


def answer_loss(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, token accuracy, labelled tokens) of ``answer_rows``' (B, L) rows: cross-entropy
    summed over the labelled tokens (the answers' own: not the prompts, the padding or an
    interpreter's block) and divided by their count; the accuracy is the share of them that
    are the model's argmax. The ``sft`` kind's loss."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    scored = targets != -100
    n = scored.sum()
    nll = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), targets, ignore_index=-100, reduction="sum"
    )
    hit = ((logits.argmax(-1) == targets) & scored).sum() / n
    return nll / n, hit.detach(), n


def answer_tokens(tokenizer: Any, answer: str) -> tuple[list[int], list[int]]:
    """The answer's token ids and labels, the interpreter's blocks (``split_turns``: a tool-use
    trace, a rollout of a run with tools) labelled -100: no loss, token count or accuracy counts
    them, and a DPO log-prob sums the model's tokens only.

    Each segment is tokenised on its own, the way a rollout holds it: the model's text up to its
    call, then the observation as the tool rollout tokenises and feeds it
    (``conspo.generation.tool_rollout``), then the model's text again. So no token straddles a
    block's edge, and the ids are those the policy reads and writes when it calls the tool (on
    the traces of conspo.training.traces the SmolLM2 and tiny tokenisers give the whole text the
    same ids anyway). Text without a block is one segment: the plain answer's ids."""
    ids: list[int] = []
    labels: list[int] = []
    for segment in split_turns(answer):
        part = tokenizer(segment.text, add_special_tokens=False)["input_ids"]
        ids += part
        labels += part if segment.kind == "model" else [-100] * len(part)
    return ids, labels


def warm_start(
    base: Path,
    out: Path,
    draw: Callable[[random.Random, Any], Pairs],
    *,
    steps: int,
    lr: float,
    warmup: int,
    seed: int = 0,
) -> Path:
    """Fine-tune ``base`` for ``steps`` steps on the pairs ``draw(rng, tokenizer)`` returns each
    step and save it (HF format) to ``out``.

    Linear warmup over ``warmup`` steps, then cosine decay to 55%: stable on a
    random init, settled at the end. AdamW (weight decay 0.01), gradients clipped at 1.
    """
    torch.manual_seed(seed)
    model, tokenizer = load_pretrained(Path(base), torch.device("cpu"), torch.float32)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, warmup)
    model.train()
    for step in range(steps):
        stopping.check()  # a run cancelled while a built-in model it needs is being built
        frac = min(1.0, (step + 1) / warmup)
        decay = 0.55 + 0.45 * math.cos(math.pi * step / steps)
        for group in optimizer.param_groups:
            group["lr"] = lr * frac * decay
        ids, mask, labels = answer_rows(tokenizer, draw(rng, tokenizer), torch.device("cpu"))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def sft(
    base: str | Path,
    tasks: list[TaskConfig],
    out: str | Path,
    *,
    steps: int = 600,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> Path:
    """Warm-start ``base`` on an equal mix of ``tasks`` (their reference answers) into ``out``.

    lr 1e-3: the tiny Qwen2 (no q/k norms) collapses at 5e-3 (0% greedy accuracy on 1-digit
    a±b after 400 steps) and learns steadily at 1e-3.
    """
    made = [make_task(cfg) for cfg in tasks]

    def draw(rng: random.Random, tokenizer: Any) -> Pairs:
        drawn = [ex for t in made for ex in t.train_prompts(rng, batch_size // len(made))]
        return [(ex.prompt, ex.answer) for ex in drawn]

    return warm_start(
        Path(base), Path(out), draw, steps=steps, lr=lr, warmup=steps // 20, seed=seed
    )
