"""The loop every non-RL job kind (``conspo.jobs``) runs: the RL trainer's setup, resume,
checkpoints, evaluation and cancellation around a kind's own step.

    def train(config, sink, should_stop, *, workdir, **inputs):
        return run_job(config, sink, should_stop, workdir=workdir, start=my_start, **inputs)

``start(state, files, store)`` returns ``step(step) -> metrics``: one optimiser step, its
metrics keyed by ``conspo.metrics`` constants. The loop adds the learning rate, the step time
and, every ``eval.every`` steps, at the end and (fresh run, ``eval.at_start``) at step 0, the
same held-out evaluation an RL run logs (``conspo.training.trainer.run_eval``), so an SFT run's
final eval and the RL run chained after it are measured alike. Checkpoints are the trainer's
(``checkpoint.every``, at the end, and at a cancel), so a resumed job continues from its last
checkpoint and re-logs nothing before it; everything random in a step is a function of
(seed, step).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from conspo import metrics as M
from conspo.access import DataFiles
from conspo.config import RunConfig
from conspo.models.store import ModelStore
from conspo.sink import Sink, StepRecord, flush_sink
from conspo.training.trainer import (
    TrainResult,
    TrainState,
    checkpoint,
    evaluated,
    lr_at,
    out_of_memory,
    resume,
    run_eval,
    setup,
)

Step = Callable[[int], dict[str, float]]
Start = Callable[[TrainState, DataFiles, ModelStore], Step]


def run_job(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    start: Start,
    model_store: ModelStore | None = None,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
) -> TrainResult:
    workdir = Path(workdir)
    files = files or DataFiles()
    store = model_store or ModelStore()
    state = setup(config, store, files, memory_limit)
    step_fn = start(state, files, store)  # before resume: what it copies is the starting policy
    last_step = resume(state, workdir, sink)
    if last_step == 0 and config.eval.at_start:
        evaluated(
            state, workdir, sink, StepRecord(0, config.steps, time.time(), run_eval(state, 0))
        )
    last_saved = last_step
    while last_step < config.steps and not should_stop():
        step = last_step + 1
        t0 = time.perf_counter()
        lr = lr_at(config, step)
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        state.model.train()
        try:
            with state.precision.autocast():
                metrics = step_fn(step)
        except torch.OutOfMemoryError as exc:
            raise out_of_memory(state, exc) from exc
        state.trained_steps = step
        metrics |= {M.LR: lr, M.TIME_STEP_S: time.perf_counter() - t0}
        every = config.eval.every
        if (every and step % every == 0) or step == config.steps:
            metrics |= run_eval(state, step)
        evaluated(state, workdir, sink, StepRecord(step, config.steps, time.time(), metrics))
        last_step = step
        every = config.checkpoint.every
        if (every and step % every == 0) or step == config.steps:
            checkpoint(state, workdir, step, sink)
            last_saved = step
    if last_step < config.steps:
        if last_saved != last_step:
            checkpoint(state, workdir, last_step, sink)
        flush_sink(sink)
        sink.log_event("finished", {"status": "cancelled", "step": last_step})
        return TrainResult("cancelled", last_step)
    flush_sink(sink)
    sink.log_event("finished", {"status": "succeeded", "step": last_step})
    return TrainResult("succeeded", last_step)


def optimiser_step(state: TrainState, loss: torch.Tensor) -> float:
    """Backward ``loss`` (scaled under float16), clip at optim.max_grad_norm, step; returns the
    gradient norm before clipping."""
    precision = state.precision
    state.optimizer.zero_grad(set_to_none=True)
    if precision.scaler is not None:
        precision.scaler.scale(loss).backward()
        precision.scaler.unscale_(state.optimizer)
    else:
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(state.trainable, state.cfg.optim.max_grad_norm)
    if precision.scaler is not None:
        precision.scaler.step(state.optimizer)
        precision.scaler.update()
    else:
        state.optimizer.step()
    return float(norm)


def sequence_logprobs(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) summed log-probs of the labelled tokens of each row, and (B,) their count.

    ``ids``/``mask``/``labels`` are (B, L) right-padded; labels are -100 where not scored."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    scored = targets != -100
    logp = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return (logp * scored).sum(-1), scored.sum(-1)


def prompt_answer_rows(
    tokenizer: object, pairs: list[tuple[str, str]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, L) ids, mask and labels of prompt + answer + EOS rows, labels -100 on
    the prompt and the padding (the loss is on the answer's tokens only)."""
    return pack_rows(tokenizer, pairs, device, max_tokens=0)


def pack_rows(
    tokenizer: object, pairs: list[tuple[str, str]], device: torch.device, max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like ``prompt_answer_rows``, with ``max_tokens`` > 0 packing consecutive examples into
    rows of at most that many tokens (an example longer than that gets a row of its own).
    Packed examples attend to the earlier ones of their row (plain concatenation, as TRL's
    packing without flash attention): fewer padding tokens, slightly leaked context."""
    encode = tokenizer  # a transformers tokenizer: called on text
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    seqs: list[tuple[list[int], list[int]]] = []
    for prompt, answer in pairs:
        p = encode(prompt, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        a = encode(answer, add_special_tokens=False)["input_ids"] + [eos]  # type: ignore[operator]
        seqs.append((p + a, [-100] * len(p) + a))
    rows: list[tuple[list[int], list[int]]] = []
    for ids, labels in seqs:
        if rows and max_tokens and len(rows[-1][0]) + len(ids) <= max_tokens:
            rows[-1] = (rows[-1][0] + ids, rows[-1][1] + labels)
        else:
            rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id  # type: ignore[attr-defined]
    out_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    out_labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, labels) in enumerate(rows):
        out_ids[i, : len(ids)] = torch.tensor(ids)
        out_labels[i, : len(ids)] = torch.tensor(labels)
        mask[i, : len(ids)] = 1
    return out_ids.to(device), mask.to(device), out_labels.to(device)
