"""Evaluation, all of it: the held-out split's greedy accuracy and pass@k, benchmarks (files of
math problems, or HumanEval) scored with avg@k and pass@k as the paper reports them, and the best
checkpoint kept.

    metrics = evaluate(model, tokenizer, task, examples, max_new_tokens=16, pass_k=4,
                       temperature=1.0, generator=g, engine=engine)

Every sample is drawn by the run's generation engine (``conspo.generation.batch.Engine``) and
verified by the task; ``sampled_pass_at_k`` is the one place k samples per problem are drawn,
verified and turned into pass@k (the held-out split's and every benchmark's).

For each benchmark of ``eval.benchmarks`` every problem gets k samples at eval.temperature and
eval.top_p; ``eval/<name>/avg@k`` is the mean correctness over all samples and problems, and
``eval/<name>/pass@k`` the mean unbiased pass@k (``pass_at_k``), with the
actual k in the key (eval/math500/avg@16). A file's answers are verified as in the math task;
HumanEval's by running its tests in the sandbox (``conspo.tasks.humaneval``). Every verifier
sees its batch first (``conspo.tasks.base.prefetch``).

``eval.best_metric`` (one of the keys an evaluation logs: the config refuses any other): after an
evaluation where it improves (its direction is the catalogue's
``better``, higher by default), the model of that step is saved as ``checkpoints/best/`` (apart
from the step_* rotation) with ``best.json`` holding {step, metric, value}.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from conspo import metrics as M
from conspo.access import DataFiles
from conspo.config import BenchmarkConfig
from conspo.generation.batch import Engine, RolloutBatch, SampleRequest
from conspo.generation.engines import NativeEngine
from conspo.generation.rollout import encode_prompts, end_token_ids
from conspo.generation.tool_rollout import verified_texts
from conspo.objectives.base import positive_mask
from conspo.rewards.base import contained_verify
from conspo.sink import (
    HELD_OUT,
    MAX_ANSWERS_PER_SOURCE,
    AnswerRecord,
    clip_text,
    episode_json,
    prompt_key,
)
from conspo.tasks.answers import verify_math
from conspo.tasks.base import Example, Task, Verifier, prefetch
from conspo.tasks.datasets import load_problems
from conspo.tasks.environment import with_episode
from conspo.tasks.humaneval import HumanEvalVerifier, humaneval_problems

BEST_DIR = "best"
BEST_FILE = "best.json"

log = logging.getLogger(__name__)


@dataclass
class Benchmark:
    name: str
    k: int
    examples: list[Example]  # prompts as the policy sees them; answers as the dataset gives
    verifier: Verifier | None = None  # how its answers are checked (None: math answers)

    @property
    def keys(self) -> tuple[str, str]:
        """(avg@k, pass@k) metric keys."""
        return M.benchmark_keys(self.name, self.k)


# what generate_and_verify hands on: (texts, examples, model lengths, verified outcomes)
AnswersSeen = Callable[[list[str], list[Example], list[int], list[float]], None]
# (texts, examples, lengths, outcomes, samples per problem) → the held-out proxy metrics
HeldOutProxy = Callable[[list[str], list[Example], list[int], list[float], int], dict[str, float]]
# handed an evaluation's problems, one record each (``AnswerRecord``)
ProblemsSeen = Callable[[list[AnswerRecord]], None]
# a batch of answers → each one's s_θ under the policy (None where it was not computed)
AnswerScorer = Callable[[RolloutBatch], list[float | None]]


def answer_records(
    source: str,
    examples: list[Example],
    answers: list[str],
    solved: list[bool],
    scores: list[float | None],
    sample_outcomes: list[float],
    k: int,
    episodes: list[Any] | None = None,
) -> list[AnswerRecord]:
    """One record per problem (the first ``MAX_ANSWERS_PER_SOURCE``): ``sample_outcomes`` holds
    the k verified outcomes of each problem in turn."""
    correct = positive_mask(torch.tensor(sample_outcomes).view(len(examples), k)).sum(-1).tolist()
    out = []
    for i, ex in enumerate(examples[:MAX_ANSWERS_PER_SOURCE]):
        episode = episodes[i] if episodes is not None else None
        out.append(
            AnswerRecord(
                source=source,
                position=i,
                key=prompt_key(ex.prompt),
                prompt=clip_text(ex.prompt),
                reference=clip_text(str(ex.answer)),
                answer=clip_text(answers[i]),
                solved=bool(solved[i]),
                score=scores[i],
                samples=k,
                samples_correct=int(correct[i]),
                episode=episode_json(episode) if episode is not None else None,
            )
        )
    return out


def load_benchmarks(benchmarks: list[BenchmarkConfig], files: DataFiles) -> list[Benchmark]:
    """Every benchmark's problems (the first ``limit``): a file's read through ``files``."""
    loaded = []
    for b in benchmarks:
        if b.source == "humaneval":
            problems = list(humaneval_problems()[: b.limit])
            loaded.append(Benchmark(b.name, b.k, problems, HumanEvalVerifier()))
            continue
        assert b.path is not None  # the config requires it of a file
        problems = load_problems(files, b.path, b.fields, ("test", "train"))
        if not problems:
            raise ValueError(f"eval.benchmarks {b.name!r}: {b.path} holds no problems")
        loaded.append(Benchmark(b.name, b.k, problems[: b.limit]))
    return loaded


def rendered(benchmark: Benchmark, render: Callable[[str], str]) -> Benchmark:
    """The benchmark with its prompts rendered (the run's prompt template); its verifier reads
    the rest of each example, as loaded."""
    examples = [replace(ex, prompt=render(ex.prompt)) for ex in benchmark.examples]
    return replace(benchmark, examples=examples)


class MathVerifier:
    """The math task's check, for benchmark files' problems."""

    name = "benchmark"

    def verify(self, completion: str, example: Example) -> float:
        return verify_math(completion, example)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021): 1 - C(n-c,k)/C(n,k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def generate_and_verify(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Verifier,
    examples: list[Example],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    engine: Engine | None = None,
    on_answers: AnswersSeen | None = None,
) -> tuple[RolloutBatch, torch.Tensor]:
    """Sample one response per example with ``engine`` (default: the native sampler); returns
    the rollouts and their (N,) rewards on CPU. ``on_answers`` is handed what was verified."""
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, [ex.prompt for ex in examples], device)
    request = SampleRequest(
        max_new_tokens=max_new_tokens,
        eos_id=end_token_ids(tokenizer, model),
        pad_id=tokenizer.pad_token_id,
        temperature=temperature,
        top_p=top_p,
        generator=generator,
        examples=examples,
    )
    batch = (engine or NativeEngine()).sample(model, ids, mask, request)
    if batch.episodes is not None:  # what each answer played: verify reads it
        examples = [with_episode(ex, ep) for ex, ep in zip(examples, batch.episodes, strict=True)]
    texts = verified_texts(tokenizer, batch)
    prefetch(task, texts, examples)
    verified = [contained_verify(task, t, ex) for t, ex in zip(texts, examples, strict=True)]
    failures = [why for _, why in verified if why is not None]
    if failures:  # a user's verify that fails scores 0, as in training, and is said once
        log.warning("verify failed on %d of %d held-out answers (scored 0): %s",
                    len(failures), len(texts), failures[0])  # fmt: skip
    rewards = torch.tensor([score for score, _ in verified])
    if on_answers is not None:
        on_answers(texts, examples, batch.model_lengths.tolist(), rewards.tolist())
    return batch, rewards


def sampled_pass_at_k(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Verifier,
    examples: list[Example],
    k: int,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    engine: Engine | None = None,
    on_answers: AnswersSeen | None = None,
) -> tuple[torch.Tensor, float]:
    """(the (N·k,) rewards of k samples of each example, the mean unbiased pass@k over the
    examples): each problem counts as solved by its positive samples (``positive_mask``)."""
    repeated = [ex for ex in examples for _ in range(k)]
    _, rewards = generate_and_verify(
        model,
        tokenizer,
        task,
        repeated,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        generator=generator,
        engine=engine,
        on_answers=on_answers,
    )
    per_problem = positive_mask(rewards.view(len(examples), k)).sum(-1).tolist()
    passes = [pass_at_k(k, int(c), k) for c in per_problem]
    return rewards, sum(passes) / len(passes)


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    examples: list[Example],
    *,
    max_new_tokens: int,
    pass_k: int,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    engine: Engine | None = None,
    proxy: HeldOutProxy | None = None,
    on_problems: ProblemsSeen | None = None,
    score_answers: AnswerScorer | None = None,
) -> dict[str, float]:
    """eval/accuracy (greedy) and eval/pass@k (k samples per prompt at ``temperature`` and
    ``top_p``) on the held-out ``examples``; with ``proxy``, the proxy-vs-truth view of the
    pass@k samples (``held_out_proxy``). ``on_problems`` is handed each problem's record (its
    greedy answer, scored by ``score_answers`` when given)."""
    if not examples:
        return {M.EVAL_ACCURACY: float("nan"), M.EVAL_PASS_AT_K: float("nan"), M.EVAL_PROBLEMS: 0.0}
    greedy_seen: list[tuple[list[str], list[Example], list[int], list[float]]] = []
    greedy_batch, greedy = generate_and_verify(
        model,
        tokenizer,
        task,
        examples,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        engine=engine,
        on_answers=None if on_problems is None else lambda *answers: greedy_seen.append(answers),
    )
    seen: list[tuple[list[str], list[Example], list[int], list[float]]] = []
    keep_samples = proxy is not None or on_problems is not None
    _, pass_k_value = sampled_pass_at_k(
        model,
        tokenizer,
        task,
        examples,
        pass_k,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        generator=generator,
        engine=engine,
        on_answers=(lambda *answers: seen.append(answers)) if keep_samples else None,
    )
    out = {
        M.EVAL_ACCURACY: greedy.mean().item(),
        M.EVAL_PASS_AT_K: pass_k_value,
        M.EVAL_PROBLEMS: float(len(examples)),
    }
    if proxy is not None and seen:
        out |= proxy(*seen[0], pass_k)
    if on_problems is not None and greedy_seen and seen:
        scores: list[float | None] = [None] * len(examples)
        if score_answers is not None:
            scores = score_answers(greedy_batch)
        on_problems(
            answer_records(
                HELD_OUT,
                examples,
                greedy_seen[0][0],
                positive_mask(greedy).tolist(),
                scores,
                seen[0][3],
                pass_k,
                greedy_batch.episodes,
            )
        )
    if greedy_batch.tool_calls is not None:
        called = [float(bool(calls)) for calls in greedy_batch.tool_calls]
        out[M.EVAL_TOOL_CALL_RATE] = sum(called) / len(called)
    played = [e for e in greedy_batch.episodes or [] if e is not None]
    if played:  # a game's greedy episodes: do the won ones take fewer turns as training goes?
        out[M.EVAL_ENV_TURNS] = sum(e.turn_count for e in played) / len(played)
    return out


def score_benchmark(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    benchmark: Benchmark,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    verifier: Verifier | None = None,
    engine: Engine | None = None,
    on_problems: ProblemsSeen | None = None,
) -> dict[str, float]:
    """{avg@k, pass@k} of ``benchmark``: k samples per problem, drawn by ``engine`` (default: the
    native sampler). ``verifier``: anything with a task's ``verify`` (default: the benchmark's
    own, else math answers). ``on_problems`` is handed each problem's record (its first sample
    as the answer, solved when any sample is)."""
    seen: list[tuple[list[str], list[Example], list[int], list[float]]] = []
    correct, pass_value = sampled_pass_at_k(
        model,
        tokenizer,
        verifier or benchmark.verifier or MathVerifier(),
        benchmark.examples,
        benchmark.k,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        generator=generator,
        engine=engine,
        on_answers=None if on_problems is None else lambda *answers: seen.append(answers),
    )
    if on_problems is not None and seen:
        k, texts, outcomes = benchmark.k, seen[0][0], seen[0][3]
        solved = positive_mask(torch.tensor(outcomes).view(-1, k)).any(-1).tolist()
        firsts = [texts[i * k] for i in range(len(benchmark.examples))]
        on_problems(
            answer_records(
                benchmark.name,
                benchmark.examples,
                firsts,
                solved,
                [None] * len(benchmark.examples),
                outcomes,
                k,
            )
        )
    avg_key, pass_key = benchmark.keys
    return {avg_key: correct.mean().item(), pass_key: pass_value}


# --------------------------------------------------------------------------------------------
# The best checkpoint
# --------------------------------------------------------------------------------------------


def higher_is_better(key: str) -> bool:
    entry = M.metric(key) or M.pattern(key)
    return entry is None or entry.better != "lower"


def best_so_far(workdir: Path) -> dict[str, object] | None:
    """The best.json of ``workdir``'s best checkpoint, if there is one."""
    path = workdir / "checkpoints" / BEST_DIR / BEST_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def improves(key: str, value: float, best: dict[str, object] | None) -> bool:
    if not math.isfinite(value):
        return False
    if best is None or best.get("metric") != key:
        return True
    previous = float(best["value"])  # type: ignore[arg-type]
    return value > previous if higher_is_better(key) else value < previous


def save_best(
    workdir: Path,
    step: int,
    key: str,
    value: float,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_state: dict[str, Any] | None = None,
) -> dict[str, object]:
    """Write ``checkpoints/best/`` (model, tokenizer, best.json) atomically; returns best.json.
    ``model_state``: the whole weights when ``model`` holds a shard (fsdp)."""
    root = workdir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    info: dict[str, object] = {"step": step, "metric": key, "value": value}
    tmp = Path(tempfile.mkdtemp(prefix=".best-", dir=root))
    stale = root / f".best-stale-{os.getpid()}"
    try:
        model.save_pretrained(tmp, state_dict=model_state)
        tokenizer.save_pretrained(tmp)
        (tmp / BEST_FILE).write_text(json.dumps(info))
        final = root / BEST_DIR
        if final.exists():
            os.replace(final, stale)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
    return info
