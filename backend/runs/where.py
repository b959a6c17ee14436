"""The runs list's query language: conditions on a run's config and on its metrics, ANDed.

    params.tau>=5 AND task.params.dataset=chain_sum
    model.lora.rank>0 and best(eval/accuracy)>0.2
    last(sep/gap)>0, algorithm!=grpo

Grammar (whitespace between tokens is free; ``AND`` in any case, ``&&`` and ``,`` mean the same):

    query     := condition (("AND" | "&&" | ",") condition)*
    condition := left op value
    left      := path | summary "(" metric ")"
    path      := name ("." name)*               a field of the run's config (its stored JSON)
    summary   := "best" | "max" | "min" | "last"   over the run's logged values of ``metric``
    metric    := [A-Za-z0-9_./@:+-]+            a metric key, e.g. eval/accuracy, sep/gap
    op        := "=" | "==" | "!=" | "<" | "<=" | ">" | ">="
    value     := number | "quoted" | 'quoted' | true | false | bare word ([A-Za-z0-9_./:@+-]+)

``best`` is the largest value (every metric users ask "best" of here is higher-is-better: accuracy,
pass@k, gap, margin; ``min`` is there for losses). A number compares as a number (a config value
that is not a number never matches), a word or quoted text as text, true/false as a boolean; a
run without the field or the metric does not match (``!=`` included: "tau != 5" asks about runs
that have a tau). The parser produces plain values; ``backend.storage.runs`` turns them into SQL
with every name and value a bound parameter — no SQL is ever made from the text.

A query that does not parse is refused with the character where it stopped and what was
expected there (``WhereError``, a 422 at ``query.where``). So is a config path that the run
config does not define and no stored run holds (``check_paths``: a misspelt ``params.tua`` would
match nothing, silently), with the closest paths it does define; and a metric key that the
catalogue does not declare and no run has stored (``check_metrics``: ``best(eval/acuracy)``),
with the closest keys it knows.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, get_origin

from pydantic import BaseModel

from conspo import metrics
from conspo.config import RunConfig
from conspo.registry import JOB_KINDS, OBJECTIVES, TASKS, Registry, annotation_arms

MAX_LENGTH = 2_000  # characters of a query
MAX_CONDITIONS = 16
MAX_DEPTH = 10  # names in a config path

Op = Literal["=", "!=", "<", "<=", ">", ">="]
Summary = Literal["best", "max", "min", "last"]
Value = float | str | bool


@dataclass(frozen=True)
class ConfigPath:
    names: tuple[str, ...]
    at: int = field(default=0, compare=False)  # the 0-based character where it starts

    def __str__(self) -> str:
        return ".".join(self.names)


@dataclass(frozen=True)
class MetricSummary:
    summary: Summary
    key: str
    at: int = field(default=0, compare=False)  # the 0-based character where its key starts

    def __str__(self) -> str:
        return f"{self.summary}({self.key})"


@dataclass(frozen=True)
class Condition:
    left: ConfigPath | MetricSummary
    op: Op
    value: Value


class WhereError(ValueError):
    """A query that does not parse: ``position`` is the 0-based character where it stopped."""

    def __init__(self, position: int, message: str) -> None:
        self.position = position
        super().__init__(f"at character {position + 1}: {message}")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_METRIC = re.compile(r"[A-Za-z0-9_./@:+\-]+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![A-Za-z0-9_./:@])")
_WORD = re.compile(r"[A-Za-z0-9_./:@+\-]+")
_OPS = ("==", "!=", "<=", ">=", "=", "<", ">")  # longest first
_AND = re.compile(r"(?:and\b|&&|,)", re.IGNORECASE)
SUMMARIES: tuple[Summary, ...] = ("best", "max", "min", "last")


@dataclass(frozen=True)
class Order:
    """``order_by``: a config path or a metric summary, ``-`` first for the largest first."""

    left: ConfigPath | MetricSummary
    descending: bool


def parse_order(text: str) -> Order:
    """``[-]path`` or ``[-]summary(metric)``, or ``WhereError``."""
    if len(text) > 300:
        raise WhereError(300, "an order is at most 300 characters")
    parser = _Parser(text)
    parser.skip()
    descending = parser.literal("-")
    left = parser.left()
    parser.skip()
    if parser.at < len(parser.text):
        raise parser.fail("the end of the order (one path or one summary)")
    return Order(left, descending)


def parse(text: str) -> list[Condition]:
    """The conditions of ``text`` (at least one), or ``WhereError``."""
    if len(text) > MAX_LENGTH:
        raise WhereError(MAX_LENGTH, f"a query is at most {MAX_LENGTH} characters")
    return _Parser(text).query()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def fail(self, expected: str) -> WhereError:
        if self.at >= len(self.text):
            return WhereError(self.at, f"expected {expected}, found the end of the query")
        found = self.text[self.at : self.at + 12]
        return WhereError(self.at, f"expected {expected}, found {found!r}")

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def match(self, pattern: re.Pattern[str]) -> str | None:
        self.skip()
        m = pattern.match(self.text, self.at)
        if m is None:
            return None
        self.at = m.end()
        return m.group(0)

    def literal(self, token: str) -> bool:
        self.skip()
        if self.text.startswith(token, self.at):
            self.at += len(token)
            return True
        return False

    def query(self) -> list[Condition]:
        conditions = [self.condition()]
        while True:
            self.skip()
            if self.at >= len(self.text):
                return conditions
            if self.match(_AND) is None:
                raise self.fail("AND (or the end of the query)")
            if len(conditions) == MAX_CONDITIONS:
                raise WhereError(self.at, f"a query has at most {MAX_CONDITIONS} conditions")
            conditions.append(self.condition())

    def condition(self) -> Condition:
        left = self.left()
        op = self.op()
        at = self.at
        value = self.value()
        if isinstance(left, MetricSummary) and not isinstance(value, float):
            raise WhereError(at, f"{left} compares with a number, not {value!r}")
        if isinstance(value, bool) and op not in ("=", "!="):
            raise WhereError(at, f"true and false compare with = or != only, not {op}")
        return Condition(left, op, value)

    def left(self) -> ConfigPath | MetricSummary:
        self.skip()
        start = self.at
        first = self.match(_NAME)
        if first is None:
            raise self.fail("a config path (params.tau) or best/max/min/last(metric)")
        if first.lower() in SUMMARIES and self.literal("("):
            self.skip()
            key_at = self.at
            key = self.match(_METRIC)
            if key is None:
                raise self.fail("a metric key such as eval/accuracy")
            if len(key) > 200:
                raise WhereError(self.at, "a metric key is at most 200 characters")
            if not self.literal(")"):
                raise self.fail("')' after the metric key")
            summary = next(s for s in SUMMARIES if s == first.lower())
            return MetricSummary(summary, key, key_at)
        names = [first]
        while self.text.startswith(".", self.at):
            self.at += 1
            name = _NAME.match(self.text, self.at)
            if name is None:
                raise self.fail("a field name after '.'")
            names.append(name.group(0))
            self.at = name.end()
            if len(names) > MAX_DEPTH:
                raise WhereError(start, f"a config path has at most {MAX_DEPTH} names")
        return ConfigPath(tuple(names), start)

    def op(self) -> Op:
        self.skip()
        for op in _OPS:
            if self.text.startswith(op, self.at):
                self.at += len(op)
                return "=" if op == "==" else op  # type: ignore[return-value]
        raise self.fail("an operator (=, !=, <, <=, >, >=)")

    def value(self) -> Value:
        self.skip()
        if self.at < len(self.text) and self.text[self.at] in "\"'":
            return self.quoted()
        number = self.match(_NUMBER)
        if number is not None:
            value = float(number)
            if not math.isfinite(value):
                raise WhereError(self.at - len(number), f"{number} is not a finite number")
            return value
        word = self.match(_WORD)
        if word is None:
            raise self.fail("a value (a number, a word, or quoted text)")
        if word.lower() in ("true", "false"):
            return word.lower() == "true"
        return word

    def quoted(self) -> str:
        quote, start = self.text[self.at], self.at
        self.at += 1
        out: list[str] = []
        while self.at < len(self.text):
            ch = self.text[self.at]
            escaped = ch == "\\" and self.at + 1 < len(self.text)
            if escaped:
                ch = self.text[self.at + 1]
            if ch == "\x00":  # no stored text holds NUL (PostgreSQL's cannot): refused
                raise WhereError(self.at, "a quoted text may not hold NUL (\\x00)")
            self.at += 2 if escaped else 1
            if ch == quote and not escaped:
                return "".join(out)
            out.append(ch)
        raise WhereError(start, f"the text opened by {quote} at character {start + 1} never ends")


# The config's dicts whose keys are the parameters of the registered entry the config names:
# any entry's parameter is a path there.
_REGISTERED_PARAMS: dict[tuple[str, ...], Registry[Any]] = {
    ("params",): OBJECTIVES,
    ("task", "params"): TASKS,
    ("kind_params",): JOB_KINDS,
}


def config_paths() -> tuple[set[str], set[str]]:
    """(every path a run config defines, the paths of its free-form objects, under which any
    key may be): read from ``RunConfig`` and every registered entry's parameter model, so a new
    field or entry is known by itself."""
    paths: set[str] = set()
    free: set[str] = set()
    _walk(RunConfig, (), paths, free)
    return paths, free


def _walk(model: type[BaseModel], prefix: tuple[str, ...], paths: set[str], free: set[str]) -> None:
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        paths.add(".".join(path))
        if path in _REGISTERED_PARAMS:
            registry = _REGISTERED_PARAMS[path]
            for entry in registry.names():
                _walk(registry.get(entry).params, path, paths, free)
            continue
        for arm in annotation_arms(info.annotation):
            if get_origin(arm) is dict:
                free.add(".".join(path))
            elif get_origin(arm) is None and isinstance(arm, type) and issubclass(arm, BaseModel):
                _walk(arm, path, paths, free)


def config_paths_of(
    conditions: Iterable[Condition] = (), order: Order | None = None
) -> Iterator[ConfigPath]:
    """The config paths that ``conditions`` and ``order`` read."""
    lefts = [c.left for c in conditions] + ([order.left] if order is not None else [])
    yield from (left for left in lefts if isinstance(left, ConfigPath))


def check_paths(paths: Iterable[ConfigPath], stored: Callable[[ConfigPath], bool]) -> None:
    """``WhereError`` at the first of ``paths`` that the run config does not define and that
    ``stored`` says no run holds (an external run's config, or one stored by an older version,
    may hold any key), naming the closest paths the config defines."""
    known: tuple[set[str], set[str]] | None = None
    for path in paths:
        known = known or config_paths()
        defined, free = known
        text = str(path)
        if text in defined or any(text.startswith(f"{f}.") for f in free) or stored(path):
            continue
        close = difflib.get_close_matches(text, sorted(defined), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise WhereError(
            path.at, f"no run config has the field {text!r} (and no stored run has it){hint}"
        )


def metric_summaries_of(
    conditions: Iterable[Condition] = (), order: Order | None = None
) -> Iterator[MetricSummary]:
    """The metric summaries that ``conditions`` and ``order`` read."""
    lefts = [c.left for c in conditions] + ([order.left] if order is not None else [])
    yield from (left for left in lefts if isinstance(left, MetricSummary))


def declared_metric(key: str) -> bool:
    """Whether the metric catalogue declares ``key``: a described key, a family's key (a
    benchmark's, a reward's, a GPU's) or a key that older runs stored under another name."""
    return (
        metrics.metric(key) is not None
        or metrics.pattern(key) is not None
        or key in metrics.LEGACY_KEYS
    )


def check_metrics(
    summaries: Iterable[MetricSummary],
    stored: Callable[[str], bool],
    known: Callable[[], Iterable[str]] = lambda: (),
) -> None:
    """``WhereError`` at the key of the first of ``summaries`` that the catalogue does not
    declare and that ``stored`` says no run holds (any run, an external one in particular, may
    log keys of its own), naming the closest of the declared keys and of ``known()`` (keys runs
    hold, asked for only then)."""
    for summary in summaries:
        if declared_metric(summary.key) or stored(summary.key):
            continue
        candidates = {m.key for m in metrics.METRICS} | set(metrics.LEGACY_KEYS) | set(known())
        close = difflib.get_close_matches(summary.key, sorted(candidates), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise WhereError(
            summary.at,
            f"no metric {summary.key!r} is in the catalogue or stored by any run{hint}",
        )
