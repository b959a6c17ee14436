"""Rollouts that call tools: generation pauses at a tool call, the call runs, its output is
appended as tokens the model did not write, and the model goes on (ReTool, arXiv:2504.11536).

    use = ToolUse(make_toolbox(cfg.tools), tokenizer)
    batch = sample_with_tools(model, prompt_ids, prompt_mask, request, use)
    batch.observation_mask      # (N, T') 1 on the interpreter's tokens
    batch.tool_calls[i]         # row i's calls: tool, status, seconds, observation tokens

One rollout is a sequence of turns. In each the model writes until its text ends with a tool's
closing tag (``</code>``), its end token, or the token budget (``max_new_tokens``, the model's
and the interpreter's tokens together). A call runs as soon as its row has made it, on a pool
of ``tools.parallel`` threads (the sandbox's processes), while the other rows go on writing;
when its output is back, ``\\n<interpreter>\\n…\\n</interpreter>\\n`` is tokenised and fed to
its row, which then writes its next turn. A call past ``max_turns`` is left as text. Rows do
not wait for each other's calls: a batch where every row waited for the slowest writer of each
turn took 1.8× the CPU of a plain batch of the same length (171 decode columns for answers of
at most 96 tokens, the waiting rows computed all along), and a row's wait is now its own call's
(bench/tool_rollout.py). Each row samples from a stream of uniforms of its own, indexed by the
tokens it has drawn, so when another row's call returns does not change what a row draws: a
step's rollouts are a function of its seed and of what the tools print (to float rounding:
where a row's empty columns fall changes the order of its attention sums).

Each row is in one of four modes at every column: writing (its token is sampled), reading (its
token is the next of its observation's), waiting (its call is running: the column is empty for
it) or done. One forward per column feeds every row's token; an empty column is masked out of
that row's attention and does not advance its position ids, so a row's logits are those of its
tokens laid end to end, to float rounding. The KV cache grows by the observation's tokens like
by any other: nothing before them is recomputed. When every unfinished row waits, generation
waits for the first call to return (``RolloutBatch.tool_seconds`` adds up those waits).

Two steppers feed the columns. Where ``conspo.generation.decode.DecodeLoop`` supports the model
(Llama, Qwen2, Mistral: SmolLM2 is Llama), its preallocated buffers are used (``tool_columns``),
finished rows leave them, and when they fill each row's tokens are moved right-aligned so the
empty columns are dropped (``realign``). Otherwise transformers' own forward extends a
``DynamicCache`` one column at a time, the attention mask marking the empty columns.

The ``hf`` engine (transformers' ``generate``) has its own path, ``generate_with_tools``: each
turn is one ``generate`` call over the prompt and everything so far (its prefix recomputed),
stopping at the closing tags. Same format, same masks, slower.

Environments (``conspo.environments``) take the same path: a row whose task plays an
environment ends its turn with its end token, as in a conversation; while its episode goes on,
that turn's text is the action its ``EpisodeRunner`` plays (on the same pool, so rows do not
wait for each other's steps), and the observation comes back as the next user turn of the chat
template (``TurnFormat``), its tokens masked like the interpreter's, the KV cache extended the
same way. The row ends at an end token once its episode is over (won, lost, failed, or at its
turn limit). ``RolloutBatch.turn_index`` says which turn each of the model's tokens belongs to
and ``RolloutBatch.episodes`` holds each row's ``Episode``: its turns, rewards and failure.

Shapes: N rows, P prompt positions, T' response positions (model and interpreter tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from conspo import stopping
from conspo.environments.base import Episode, Turn
from conspo.environments.runner import EpisodeRunner
from conspo.generation.batch import (
    STOP_CHECK_COLUMNS,
    CallRecord,
    GenerationStopped,
    RolloutBatch,
    SampleRequest,
)
from conspo.generation.decode import DecodeLoop
from conspo.generation.forward import Prefill, prefill
from conspo.generation.rollout import COMPACT_CHECK_EVERY, _next_token
from conspo.tools import ToolBox, ToolCall, ToolResult, observation_text
from conspo.tools.base import tool_columns

# While every unfinished row waits on a tool call, the wait is cut into slices this long so a
# cancel (``_stop_if_asked``) is seen within one of them, however long the call may run.
TOOL_WAIT_SLICE_S = 0.5
# The most environment steps one batch runs at once (each in a thread of the call pool): they
# are Python calls, so more threads than this add switching, not speed.
ENVIRONMENT_THREADS = 32


@dataclass(frozen=True)
class TurnFormat:
    """The text around an environment's observation once the model has ended its turn with its
    end token: the chat template's user turn, then the assistant turn opened again."""

    before: str
    after: str

    def wrap(self, observation: str) -> str:
        return f"{self.before}{observation}{self.after}"


# Stand-ins rendered through a chat template to find the text around a user turn.
_ANSWER, _OBSERVATION = "\x00answer\x00", "\x00observation\x00"


def turn_format(tokenizer: PreTrainedTokenizerBase, chat: bool) -> TurnFormat:
    """How an observation follows the model's turn: the chat template's own user turn (the text
    between the end of an assistant message and a user message's content, and after it up to
    the next assistant turn), less the end token the model wrote itself; without a chat
    template, plain "User:" / "Assistant:" lines."""
    if not chat:
        return TurnFormat("\nUser: ", "\nAssistant: ")
    messages = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": _ANSWER},
        {"role": "user", "content": _OBSERVATION},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)
    around = text[text.index(_ANSWER) + len(_ANSWER) :]
    before, after = around.split(_OBSERVATION, 1)
    ends = [str(tokenizer.decode([i])) for i in _end_ids(tokenizer)]
    for end in sorted(ends, key=len, reverse=True):
        if end and before.startswith(end):  # the model wrote it: its turn ended with it
            before = before[len(end) :]
            break
    return TurnFormat(before, after)


def _end_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return [i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id]


@dataclass(frozen=True)
class EnvironmentPlay:
    """A run's environment: how to start one row's episode (``start(example, seed)``: an
    ``EpisodeRunner`` not yet reset, None for an example that is no game of it, such as a
    benchmark's problem) and how its observations read (``TurnFormat``)."""

    start: Callable[[Any, int], EpisodeRunner | None]
    format: TurnFormat

    def episodes(
        self, examples: Sequence[Any] | None, group_size: int
    ) -> list[EpisodeRunner | None]:
        """One reset episode per row: rollout j of a group plays its example's game with seed
        j (the environment's own randomness, when it has any)."""
        if examples is None:
            raise ValueError("an environment run samples with each row's example given")
        g = max(1, group_size)
        runners = [self.start(example, i % g) for i, example in enumerate(examples)]
        for runner in runners:
            if runner is not None:
                runner.reset()  # a failure fails that episode only (``EpisodeRunner.reset``)
        return runners


@dataclass(frozen=True)
class EnvironmentAction:
    """A row's turn played as an action of its episode."""

    text: str


@dataclass(frozen=True)
class ToolUse:
    """What a rollout with tools needs beyond a plain one: the run's tools and the tokenizer
    that turns their output into tokens (and the model's text back into calls); for a run that
    plays an environment, the environment and (per batch) each row's episode."""

    box: ToolBox
    tokenizer: PreTrainedTokenizerBase
    environment: EnvironmentPlay | None = None
    episodes: tuple[EpisodeRunner | None, ...] | None = None  # one per row, set per batch

    @property
    def has_tools(self) -> bool:
        return bool(self.box.closing_tags)


class Mode(Enum):
    WRITING = 0
    READING = 1
    WAITING = 2
    DONE = 3


@dataclass
class _Row:
    """One rollout's state, on the host."""

    tokens: list[int] = field(default_factory=list)
    observed: list[bool] = field(default_factory=list)  # per token: the interpreter's
    mode: Mode = Mode.WRITING
    segment_start: int = 0  # where the model's current stretch of text begins in ``tokens``
    queue: list[int] = field(default_factory=list)  # observation tokens still to feed
    pending: ToolCall | EnvironmentAction | None = None
    calls: list[CallRecord] = field(default_factory=list)
    truncated: bool = False
    episode: EpisodeRunner | None = None  # the environment's episode this row plays
    turn: int = 0  # the environment turn the model writes now
    turn_of: list[int] = field(default_factory=list)  # per token: its turn, -1 observed


@lru_cache(maxsize=8)
def _closer_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Token ids whose text holds '>': the only tokens that can end a closing tag, so the only
    ones after which the model's text is decoded to look for a call."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return frozenset(i for i, piece in enumerate(pieces) if piece is not None and ">" in piece)


class _Stepper(Protocol):
    def step(self, tokens: torch.Tensor, t: int, positions: torch.Tensor) -> torch.Tensor: ...

    def hide(self, rows: torch.Tensor, t: int) -> None: ...

    def realign(self, real: torch.Tensor) -> int | None: ...

    def drop_finished(self, done: torch.Tensor) -> None: ...


class _DecodeStepper:
    """Columns through ``DecodeLoop``'s buffers (``capacity`` response columns)."""

    def __init__(self, model: PreTrainedModel, state: Prefill, capacity: int) -> None:
        assert isinstance(state.cache, DynamicCache)
        self.loop = DecodeLoop(
            model, state.cache, state.mask, state.next_position, capacity, rotary_table=False
        )
        self.capacity = capacity

    def step(self, tokens: torch.Tensor, t: int, positions: torch.Tensor) -> torch.Tensor:
        here = positions.index_select(0, self.loop.rows)[:, None]  # rows still in the buffers
        cos, sin = self.loop.rotary(here)
        return self.loop.step_at(tokens, t, cos, sin)

    def hide(self, rows: torch.Tensor, t: int) -> None:
        mine = rows.index_select(0, self.loop.rows)  # (R,) bool over the buffers' rows
        self.loop.bias[mine, :, :, self.loop.prompt_len + t] = float("-inf")

    def realign(self, real: torch.Tensor) -> int | None:
        """Move each row's tokens right-aligned over the first columns: ``real`` (N, t) bool says
        which of the t response columns hold a token of that row. Returns the new t."""
        loop, p = self.loop, self.loop.prompt_len
        real = real.index_select(0, loop.rows)  # (R, t)
        counts = real.sum(-1)  # (R,)
        width = int(counts.max()) if len(counts) else 0
        t = real.shape[1]
        # For each row, the columns of its tokens in order, right-aligned in `width` slots; the
        # slots left of them read column 0 and are masked.
        order = torch.argsort((~real).long(), dim=1, stable=True)[:, :width]  # tokens first
        slot = torch.arange(width, device=real.device)
        shift = (width - counts)[:, None]  # (R, 1) empty slots at the left
        source = order.gather(1, (slot[None, :] - shift).clamp(min=0))  # (R, width)
        empty = slot[None, :] < shift  # (R, width)
        index = (p + source)[:, None, :, None]  # (R, 1, width, 1)
        for buffers in (loop.keys, loop.values):
            for buf in buffers:
                moved = buf.gather(2, index.expand(-1, buf.shape[1], -1, buf.shape[3]))
                buf[:, :, p : p + width] = moved
        loop.bias[..., p : p + t] = 0.0
        loop.bias[..., p : p + width].masked_fill_(empty[:, None, None, :], float("-inf"))
        return width

    def drop_finished(self, done: torch.Tensor) -> None:
        self.loop.drop_finished(done)


class _ForwardStepper:
    """Columns through transformers' forward, extending a ``DynamicCache``: any causal LM."""

    def __init__(self, model: PreTrainedModel, state: Prefill) -> None:
        self.model = model
        self.cache = state.cache
        self.mask = state.mask  # (N, P + columns fed so far)
        self.prompt_len = state.mask.shape[1]

    def step(self, tokens: torch.Tensor, t: int, positions: torch.Tensor) -> torch.Tensor:
        column = torch.ones_like(self.mask[:, :1])
        self.mask = torch.cat([self.mask, column], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=positions[:, None],
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()

    def hide(self, rows: torch.Tensor, t: int) -> None:
        self.mask[rows, self.prompt_len + t] = 0

    def realign(self, real: torch.Tensor) -> int | None:
        return None  # the cache grows by concatenation anyway

    def drop_finished(self, done: torch.Tensor) -> None:
        pass


@torch.no_grad()
def sample_with_tools(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    request: SampleRequest,
    use: ToolUse,
    *,
    decode_loop: bool = True,
) -> RolloutBatch:
    """One rollout per row of ``prompt_ids`` (N, P) that may call ``use.box``'s tools: the
    native engine's path (module docstring). ``request.max_new_tokens`` bounds each row's model
    and observation tokens together."""
    n, p = prompt_ids.shape
    device = prompt_ids.device
    budget = request.max_new_tokens
    g = request.group_size if request.group_size > 1 and n % request.group_size == 0 else 1
    state = prefill(model, prompt_ids, prompt_mask, g, None, share_prefix=True)
    positions = state.next_position.squeeze(1).clone()  # (N,) the next token's position id
    logits = state.logits
    capacity = tool_columns(budget)
    stepper: _Stepper
    if decode_loop and DecodeLoop.supports(model, p + capacity):
        stepper = _DecodeStepper(model, state, capacity)
    else:
        stepper = _ForwardStepper(model, state)
    del state
    # Each row's own stream of uniforms, indexed by the tokens it has sampled: a row's draws do
    # not depend on how long other rows' calls took.
    noise = None
    if request.temperature > 0:
        noise = torch.rand(
            n, budget + 1, generator=request.generator, device=device, dtype=torch.float64
        )
    stops = set(request.stop_ids)
    closers = _closer_ids(use.tokenizer)
    rows = _rows(n, use)
    drawn_so_far = torch.zeros(n, dtype=torch.long, device=device)
    real = torch.zeros(n, capacity, dtype=torch.bool, device=device)  # (N, columns) fed
    calls: dict[int, Future[ToolResult | Turn]] = {}  # row → its pending call
    blocked = 0.0  # seconds every unfinished row waited for a call
    t = 0
    # an environment's steps are Python calls of their own: rows wait on their own, up to a
    # bound (a step holds its thread for at most the environment's timeout)
    workers = use.box.parallel + (min(n, ENVIRONMENT_THREADS) if use.episodes is not None else 0)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool-call")
    try:
        while True:
            for i in [i for i, call in calls.items() if call.done()]:
                _start_reading(rows[i], calls.pop(i).result(), use, budget)
            modes = [row.mode for row in rows]
            if all(m is Mode.DONE for m in modes):
                break
            if not any(m in (Mode.WRITING, Mode.READING) for m in modes):
                _stop_if_asked(request, True)
                started = time.perf_counter()  # nothing to feed: wait for the first output
                # in slices, so that a cancel is seen while a long call runs
                wait(list(calls.values()), timeout=TOOL_WAIT_SLICE_S, return_when=FIRST_COMPLETED)
                blocked += time.perf_counter() - started
                continue
            uniforms = None if noise is None else noise.gather(1, drawn_so_far[:, None])[:, 0]
            sampled = _next_token(
                logits, request.temperature, request.top_p, request.generator, uniforms
            )
            drawn = sampled.tolist()  # the host decides each row's token (a sync per column)
            feed = [request.pad_id] * n
            fed = [False] * n
            for i, row in enumerate(rows):
                if row.mode is Mode.WRITING:
                    feed[i], fed[i] = drawn[i], True
                    _write(row, drawn[i], stops, closers, use, budget)
                    if row.pending is not None:  # it made a call: run it now, write on later
                        calls[i] = pool.submit(_perform, row.pending, row, use)
                elif row.mode is Mode.READING:
                    feed[i], fed[i] = row.queue.pop(0), True
                    _read(row, feed[i], budget)
            if t >= real.shape[1]:
                t = _realign(stepper, real, t)
                if t >= real.shape[1]:  # the stepper keeps every column: room for more
                    real = torch.cat([real, torch.zeros_like(real)], dim=1)
            fed_t = torch.tensor(fed, device=device)
            wrote = torch.tensor([m is Mode.WRITING for m in modes], device=device)
            logits = stepper.step(torch.tensor(feed, device=device), t, positions)
            stepper.hide(~fed_t, t)
            real[:, t] = fed_t
            positions = positions + fed_t.long()
            drawn_so_far = drawn_so_far + wrote.long()
            t += 1
            if t % COMPACT_CHECK_EVERY == 0:
                stepper.drop_finished(
                    torch.tensor([r.mode is Mode.DONE for r in rows], device=device)
                )
            _stop_if_asked(request, t % STOP_CHECK_COLUMNS == 0)
    except BaseException:
        # Stopped or failed: calls still running end at their own timeout in the sandbox;
        # waiting for them here would hold a cancel that long.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return _assemble(rows, prompt_ids, prompt_mask, request.pad_id, blocked, use)


def _rows(n: int, use: ToolUse) -> list[_Row]:
    if use.episodes is None:
        return [_Row() for _ in range(n)]
    if len(use.episodes) != n:
        raise ValueError(f"{len(use.episodes)} episodes for {n} rows")
    return [_Row(episode=episode) for episode in use.episodes]


def _perform(pending: ToolCall | EnvironmentAction, row: _Row, use: ToolUse) -> ToolResult | Turn:
    """A row's call, on the pool: its tool's, or its turn played in its episode (contained by
    ``EpisodeRunner``: whatever the environment does comes back as a ``Turn``)."""
    if isinstance(pending, EnvironmentAction):
        assert row.episode is not None
        return row.episode.step(pending.text)
    return use.box.run_one(pending)


def _stop_if_asked(request: SampleRequest, now: bool) -> None:
    stopping.check()  # an abandoned run: at every column (a thread-local flag)
    if now and request.should_stop is not None and request.should_stop():
        raise GenerationStopped("stopped between tokens of a rollout that calls tools")


def _write(
    row: _Row,
    token: int,
    stops: set[int],
    closers: frozenset[int],
    use: ToolUse,
    budget: int,
) -> None:
    """The model wrote ``token``: end the row at a stop token or the budget, or pause it at a
    complete tool call (while it has calls left)."""
    row.tokens.append(token)
    row.observed.append(False)
    row.turn_of.append(row.turn)
    if token in stops:
        if row.episode is not None and not row.episode.over:  # its turn, played
            row.pending = EnvironmentAction(_segment_text(row, use))
            row.mode = Mode.WAITING
            return
        row.mode = Mode.DONE
        return
    if len(row.tokens) >= budget:
        row.mode, row.truncated = Mode.DONE, True
        return
    if token in closers and use.has_tools and len(row.calls) < use.box.max_turns:
        call = use.box.call_in(_segment_text(row, use))
        if call is not None:
            row.pending, row.mode = call, Mode.WAITING


def _read(row: _Row, token: int, budget: int) -> None:
    """``token`` of the row's observation was fed; the model writes again after the last."""
    row.tokens.append(token)
    row.observed.append(True)
    row.turn_of.append(-1)
    if not row.queue:
        row.segment_start = len(row.tokens)
        row.mode = Mode.WRITING if len(row.tokens) < budget else Mode.DONE
        row.truncated = row.mode is Mode.DONE


def _start_reading(row: _Row, result: Any, use: ToolUse, budget: int) -> None:
    """Queue the observation of ``result`` for ``row``, cut to what is left of its budget; a
    row whose episode that turn ended is done."""
    assert row.pending is not None
    room = budget - len(row.tokens)
    if isinstance(result, Turn):
        assert row.episode is not None and use.environment is not None
        row.pending, row.turn = None, row.turn + 1
        if row.episode.over:
            row.mode = Mode.DONE
            return
        text = use.environment.format.wrap(result.observation)
        ids = use.tokenizer(text, add_special_tokens=False).input_ids[:room]
    else:
        ids = use.tokenizer(observation_text(result), add_special_tokens=False).input_ids
        ids = ids[:room]
        assert isinstance(row.pending, ToolCall)
        row.calls.append(CallRecord(row.pending.tool, result.status, result.seconds, len(ids)))
        row.pending = None
    if ids:
        row.queue, row.mode = list(ids), Mode.READING
    else:
        row.mode, row.truncated = Mode.DONE, True


def _realign(stepper: _Stepper, real: torch.Tensor, t: int) -> int:
    """Drop the empty columns where the stepper can (rows right-aligned); the new t."""
    if bool(real[:, :t].all()):
        return t
    width = stepper.realign(real[:, :t])
    if width is None:
        return t
    counts = real[:, :t].sum(-1)  # (N,)
    real.zero_()
    slot = torch.arange(width, device=real.device)
    real[:, :width] = slot[None, :] >= (width - counts)[:, None]
    return width


def _assemble(
    rows: Sequence[_Row],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    pad_id: int,
    seconds: float,
    use: ToolUse,
) -> RolloutBatch:
    n, device = len(rows), prompt_ids.device
    width = max(1, max(len(r.tokens) for r in rows))
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros(n, width)
    observed = torch.zeros(n, width)
    for i, row in enumerate(rows):
        k = len(row.tokens)
        ids[i, :k] = torch.tensor(row.tokens, dtype=torch.long)
        mask[i, :k] = 1.0
        observed[i, :k] = torch.tensor(row.observed, dtype=torch.float32)
    turn_index, episodes = None, None
    if use.episodes is not None:
        turn_index = torch.full((n, width), -1, dtype=torch.long)
        for i, row in enumerate(rows):
            turn_index[i, : len(row.turn_of)] = torch.tensor(row.turn_of, dtype=torch.long)
        turn_index = turn_index.to(device)
        episodes = [_finished(row) for row in rows]
    return RolloutBatch(
        prompt_ids,
        prompt_mask,
        ids.to(device),
        mask.to(device),
        mask.sum(-1).long().to(device),
        torch.tensor([r.truncated for r in rows], device=device),
        observed.to(device),
        [r.calls for r in rows] if use.has_tools else None,
        seconds,
        None,
        turn_index,
        episodes,
    )


def _finished(row: _Row) -> Episode | None:
    """The row's episode as played: its final reward read and the environment closed."""
    return None if row.episode is None else row.episode.finish(cut=row.truncated)


def verified_texts(tokenizer: PreTrainedTokenizerBase, batch: RolloutBatch) -> list[str]:
    """What a verifier reads of each rollout: the model's text after its last observation (the
    answer it gives once it has read the interpreter), or the whole response without tools.
    The interpreter's output never counts as the model's answer."""
    if batch.observation_mask is None:
        return tokenizer.batch_decode(batch.response_ids.cpu().tolist(), skip_special_tokens=True)
    ids = batch.response_ids.cpu()
    observed = batch.observation_mask.cpu() > 0
    lengths = batch.lengths.cpu().tolist()
    tails = []
    for row, seen, k in zip(ids, observed, lengths, strict=True):
        last = int(seen[:k].nonzero().max()) + 1 if bool(seen[:k].any()) else 0
        tails.append(row[last:k].tolist())
    return tokenizer.batch_decode(tails, skip_special_tokens=True)


def generate_with_tools(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    request: SampleRequest,
    use: ToolUse,
    generate: Any,
) -> RolloutBatch:
    """The ``hf`` engine's path: each turn one ``generate(ids, mask, max_new_tokens, stops)``
    call (the engine's, seeded from ``request.generator``) over every unfinished row's prompt
    and response so far, cut at the first complete tool call; then the turn's calls run together
    and their observations are appended, as on the native path."""
    n = prompt_ids.shape[0]
    budget = request.max_new_tokens
    stops = set(request.stop_ids)
    closers = _closer_ids(use.tokenizer)
    rows = [_Row() for _ in range(n)]
    seconds = 0.0
    while active := [i for i, r in enumerate(rows) if r.mode is Mode.WRITING]:
        room = max(budget - len(rows[i].tokens) for i in active)
        ids, mask = _prefixes(rows, active, prompt_ids, prompt_mask, request.pad_id)
        new = generate(ids, mask, room, use.box.closing_tags)  # (A, k) token ids
        for i, out in zip(active, new.cpu().tolist(), strict=True):
            row = rows[i]
            for token in out:
                _write(row, token, stops, closers, use, budget)
                # generate stops a row at any closing tag (then pads it); the native path
                # writes on after one that makes no call (unopened, or past max_turns), and so
                # does the next turn here
                if row.mode is not Mode.WRITING or (token in closers and _at_closer(row, use)):
                    break
            else:  # generate ran out of room for this row before its own budget
                row.mode, row.truncated = Mode.DONE, True
        waiting = [i for i, r in enumerate(rows) if r.mode is Mode.WAITING]
        _stop_if_asked(request, bool(waiting))
        started = time.perf_counter()
        results = use.box.run([rows[i].pending for i in waiting])  # type: ignore[misc]
        seconds += time.perf_counter() - started
        for i, result in zip(waiting, results, strict=True):
            row = rows[i]
            _start_reading(row, result, use, budget)
            while row.queue:  # the whole observation at once: the next generate re-reads it
                _read(row, row.queue.pop(0), budget)
    return _assemble(rows, prompt_ids, prompt_mask, request.pad_id, seconds, use)


def _at_closer(row: _Row, use: ToolUse) -> bool:
    """Whether the row's current text ends with a tool's closing tag."""
    text = _segment_text(row, use).rstrip()
    return any(text.endswith(tag) for tag in use.box.closing_tags)


def _segment_text(row: _Row, use: ToolUse) -> str:
    """The model's text since its last observation (or the start)."""
    text = use.tokenizer.decode(row.tokens[row.segment_start :], skip_special_tokens=True)
    return text if isinstance(text, str) else "".join(text)


def _prefixes(
    rows: Sequence[_Row],
    active: list[int],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (prompt + response so far) of the ``active`` rows."""
    seqs = []
    for i in active:
        prompt = prompt_ids[i][prompt_mask[i].bool()].tolist()
        seqs.append(prompt + rows[i].tokens)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for j, seq in enumerate(seqs):
        ids[j, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[j, width - len(seq) :] = 1
    return ids.to(prompt_ids.device), mask.to(prompt_ids.device)


class ToolEngine:
    """An engine whose every ``sample`` may call tools: a run with tools hands this to its
    trainer and its evaluation, which then need not know that rollouts have turns."""

    def __init__(self, inner: Any, use: ToolUse) -> None:
        self.inner = inner
        self.use = use

    def sample(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
    ) -> RolloutBatch:
        use = self.use
        if use.environment is not None:  # this batch's episodes, one per row
            episodes = use.environment.episodes(request.examples, request.group_size)
            use = replace(use, episodes=tuple(episodes))
        return self.inner.sample_with_tools(model, prompt_ids, prompt_mask, request, use)

    def sample_with_tools(
        self,
        model: PreTrainedModel,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        request: SampleRequest,
        use: ToolUse,
    ) -> RolloutBatch:
        return self.inner.sample_with_tools(model, prompt_ids, prompt_mask, request, use)

    def sync(self, model: PreTrainedModel) -> None:
        self.inner.sync(model)

    def close(self) -> None:
        self.inner.close()
