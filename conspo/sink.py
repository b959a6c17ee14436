"""How the trainer reports: a ``Sink`` receives one ``StepRecord`` per finished step.

The trainer calls ``sink.log_step(record)`` once per step (after the optimiser step, after any
evaluation of that step) and ``sink.log_event(kind, data)`` for lifecycle events. After a resume
from a checkpoint the trainer re-emits the steps after the checkpoint; sinks must treat a step
they already have as an overwrite (idempotent upsert), never as a duplicate.

A sink may buffer steps and write them in batches. It then offers ``flush()``, which the trainer
calls before it saves each checkpoint and before its ``finished`` event: every step a
checkpoint covers is stored by then, and a crash can only lose buffered steps after the last
checkpoint, which the resumed run re-emits. ``flush`` is optional (``flush_sink`` skips a sink
without one); a sink that writes each step at once needs none.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from conspo.environments.base import Episode

# The text a rollout record keeps of its prompt and of its completion, at most (characters; the
# rest is cut and marked with "…"): enough to read an answer, bounded so the sample stays small.
ROLLOUT_TEXT_CHARS = 2000


def clip_text(text: str, limit: int = ROLLOUT_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with a trailing "…"."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# What a rollout record keeps of its episode: each action and observation at most this many
# characters (up to 64 turns of both, so a sampled rollout stays ~tens of kB at the worst), and
# a turn's ``info`` only when its JSON is this small (an environment may put a whole board in it).
EPISODE_TEXT_CHARS = 1000
EPISODE_INFO_CHARS = 1000
EPISODE_REASON_CHARS = 300  # a turn's error, the episode's failure


def episode_json(episode: Episode) -> dict[str, Any]:
    """``episode.as_dict()`` as a rollout record keeps it: texts clipped (``clip_text``'s "…"
    says where), a large ``info`` dropped (``info_dropped`` says so), and every text valid
    Unicode (a lone surrogate, which an environment's text or info may hold and neither a
    database nor a JSON response takes, becomes U+FFFD)."""
    data = episode.as_dict()
    data["first_observation"] = clip_text(data["first_observation"])
    if data["failure"] is not None:
        data["failure"] = clip_text(data["failure"], EPISODE_REASON_CHARS)
    for turn in data["turns"]:
        turn["action"] = clip_text(turn["action"], EPISODE_TEXT_CHARS)
        turn["observation"] = clip_text(turn["observation"], EPISODE_TEXT_CHARS)
        if turn["error"] is not None:
            turn["error"] = clip_text(turn["error"], EPISODE_REASON_CHARS)
        info = _valid_unicode(turn["info"])
        turn["info"] = info if len(json.dumps(info)) <= EPISODE_INFO_CHARS else {}
        turn["info_dropped"] = info != turn["info"]
    result: dict[str, Any] = _valid_unicode(data)
    return result


def _valid_unicode(value: Any) -> Any:
    """``value`` (JSON data) with every lone surrogate in its texts and keys replaced."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # the UTF-16 round trip keeps surrogate pairs, replaces the rest
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_unicode(v) for v in value]
    return value


@dataclass
class RolloutRecord:
    """One sampled rollout of a step: its score and reward (the positive/negative score
    distributions) and its text (the run page's rollout table), each text at most
    ``ROLLOUT_TEXT_CHARS`` characters ("" when the producer kept none)."""

    group: int  # index of the prompt group within the step
    index: int  # index of the rollout within its group
    reward: float
    score: float  # length-normalised log-prob s_θ(o) under the policy that sampled it
    length: int  # the model's response tokens incl. EOS (a tool's output is not counted)
    truncated: bool  # hit max_new_tokens without EOS
    prompt: str = ""  # the prompt the policy saw (chat template applied), clipped
    completion: str = ""  # the sampled response, special tokens dropped, clipped
    # A rollout that played an environment: its episode as ``episode_json`` keeps it (the first
    # observation, then each turn's action, observation, reward, done and error, and the
    # outcome); None for a rollout that played none.
    episode: dict[str, Any] | None = None
    # The critique a reward gave with its value (a judge's first judgement), clipped; None
    # where no reward gave one.
    critique: str | None = None


@dataclass
class PromptRecord:
    """One prompt of a step: how many of its rollouts were sampled and verified correct.

    ``key`` identifies the prompt across steps (and across runs of the same task and prompt
    template): ``prompt_key`` of the prompt text the policy saw. A prompt drawn twice in one
    step (two groups, or a refill round) is one record with the counts added up.
    """

    key: str
    n: int  # rollouts sampled (the group size, times the groups it had)
    correct: int  # of them verified correct


PROMPT_KEY_CHARS = 16  # hex digits of the hash: 64 bits, no collision in any realistic task


def prompt_key(text: str) -> str:
    """The stable key of a prompt: the first 64 bits of the SHA-256 of its text, in hex."""
    return hashlib.sha256(text.encode()).hexdigest()[:PROMPT_KEY_CHARS]


HELD_OUT = "held_out"  # AnswerRecord.source of the held-out split (else a benchmark's name)
MAX_ANSWERS_PER_SOURCE = 2000  # problems an evaluation keeps per split or benchmark, at most


@dataclass
class AnswerRecord:
    """One problem of one evaluation: what the model answered and whether it was right, so runs
    can be compared problem by problem (the same problem, the same seed, each run's answer).

    Held-out split: ``answer`` is the greedy answer, ``solved`` its verified outcome, ``score``
    its s_θ (the length-normalised log-prob the separation statistics use, under the policy at
    temperature 1; None where it was not computed), and ``samples`` / ``samples_correct`` the
    pass@k draws. A benchmark draws no greedy answer: ``answer`` is its first sample, ``solved``
    whether any of its k samples is correct (the pass@k event)."""

    source: str  # HELD_OUT or a benchmark's name
    position: int  # the problem's index in its split (stable across a run's evaluations)
    key: str  # prompt_key of the prompt the policy saw: the same problem across runs
    prompt: str  # clipped, as every stored text
    reference: str  # the dataset's answer, clipped
    answer: str
    solved: bool
    score: float | None
    samples: int
    samples_correct: int
    episode: dict[str, Any] | None = None  # the greedy answer's episode (an environment's)


@dataclass
class StepRecord:
    step: int  # 1-based; the last step equals config.steps
    total_steps: int
    wall_time: float  # unix time the step finished
    metrics: dict[str, float]  # slash-namespaced keys of conspo.metrics (sep/gap, ...)
    rollouts: list[RolloutRecord] = field(default_factory=list)
    prompts: list[PromptRecord] = field(default_factory=list)  # every prompt of the step
    answers: list[AnswerRecord] = field(default_factory=list)  # an evaluation's, problem by problem


class Sink(Protocol):
    def log_step(self, record: StepRecord) -> None: ...

    def log_event(self, kind: str, data: dict[str, Any]) -> None: ...

    # Optional: def flush(self) -> None, store every step logged so far (see the docstring).


def flush_sink(sink: Sink) -> None:
    """``sink.flush()`` when the sink has one (buffering sinks); nothing otherwise."""
    flush = getattr(sink, "flush", None)
    if flush is not None:
        flush()


class NullSink:
    """What ranks other than 0 log to: nothing."""

    def log_step(self, record: StepRecord) -> None:
        pass

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        pass


class MemorySink:
    """Keeps every record by step (a re-emitted step replaces the old one). Used by tests."""

    def __init__(self) -> None:
        self.steps: dict[int, StepRecord] = {}
        self.events: list[tuple[str, dict[str, Any]]] = []

    def log_step(self, record: StepRecord) -> None:
        self.steps[record.step] = record

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))

    def flush(self) -> None:
        pass  # every step is kept at once


class JsonlSink:
    """Appends one JSON line per step to ``metrics.jsonl`` (the CLI's output)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log_step(self, record: StepRecord) -> None:
        row = {"step": record.step, "wall_time": record.wall_time, **record.metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def log_event(self, kind: str, data: dict[str, Any]) -> None:
        with self.path.with_name("events.jsonl").open("a") as f:
            f.write(json.dumps({"event": kind, **data}) + "\n")

    def flush(self) -> None:
        pass  # each line is written (and the file closed) as it comes
