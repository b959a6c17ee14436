"""The code task's problem templates: small functions to write, in three levels.

A template draws its constants from the rng (a threshold, a base, a set of coins, …) and returns
a ``Spec``: the function's name and signature, what it must do, a reference body, how to draw one
call's arguments, and a plausible wrong body (an off-by-one, a forgotten case), which the tests
use to show that the hidden tests catch a near miss. The constants make the problem space large:
each level holds a few thousand distinct problems.

Levels: 1, one-line transformations of lists, strings and numbers; 2, loops with a condition or
an accumulator; 3, small algorithms (dynamic programming, stacks, searches).

Every value a reference takes or returns is a literal (ints, strings, bools, lists, tuples), so
that a test's arguments and a result travel in and out of the sandbox as ``repr`` text.
"""

from __future__ import annotations

import math
import random
import string
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

Arguments = tuple[Any, ...]


@dataclass(frozen=True)
class Spec:
    name: str  # the function's name
    params: str  # its parameters, annotated: "nums: list[int]"
    returns: str  # its return annotation: "list[int]"
    doc: str  # what it must do
    body: str  # the reference implementation's body
    wrong: str  # a plausible wrong body (a near miss the hidden tests must catch)
    inputs: Callable[[random.Random], Arguments]  # one call's arguments

    @property
    def identity(self) -> str:
        """What tells problems apart: every constant of a template is in its text."""
        return f"{self.signature}\n{self.doc}"

    @property
    def signature(self) -> str:
        return f"def {self.name}({self.params}) -> {self.returns}:"

    def source(self, body: str | None = None) -> str:
        """The function with ``body`` (default: the reference)."""
        code = textwrap.dedent(self.body if body is None else body).strip()
        return f"{self.signature}\n{textwrap.indent(code, '    ')}\n"


Template = Callable[[random.Random], Spec]
TEMPLATES: dict[int, list[Template]] = {1: [], 2: [], 3: []}


def template(level: int) -> Callable[[Template], Template]:
    def add(fn: Template) -> Template:
        TEMPLATES[level].append(fn)
        return fn

    return add


# --------------------------------------------------------------------------------------------
# Drawing arguments
# --------------------------------------------------------------------------------------------


def ints(r: random.Random, lo: int, hi: int, min_len: int = 1, max_len: int = 8) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(min_len, max_len))]


def word(r: random.Random, alphabet: str, min_len: int, max_len: int) -> str:
    return "".join(r.choice(alphabet) for _ in range(r.randint(min_len, max_len)))


def signed(value: int) -> str:
    """ " + 3" or " - 3": a constant added in an expression."""
    return f" + {value}" if value >= 0 else f" - {-value}"


def linear(k: int, c: int) -> str:
    """The expression x * k + c, written plainly (x, x * 3, x - 2, x * 3 + 1)."""
    scaled = "x" if k == 1 else f"x * {k}"
    return scaled if c == 0 else scaled + signed(c)


def ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def letters(r: random.Random, n: int) -> list[str]:
    return r.sample(string.ascii_lowercase, n)


# --------------------------------------------------------------------------------------------
# Level 1: one-line transformations
# --------------------------------------------------------------------------------------------


@template(1)
def scale_and_shift(r: random.Random) -> Spec:
    a, b = r.randint(2, 9), r.choice([v for v in range(-20, 21) if v != 0])
    return Spec(
        "scale_and_shift", "nums: list[int]", "list[int]",
        f"Return a new list holding {linear(a, b)} for every element x of nums, in order.",
        f"return [{linear(a, b)} for x in nums]",
        f"return [(x{signed(b)}) * {a} for x in nums]",
        lambda r: (ints(r, -30, 30),),
    )  # fmt: skip


COMPARISONS = {
    ">": ("greater than", ">="),
    ">=": ("greater than or equal to", ">"),
    "<": ("less than", "<="),
    "<=": ("less than or equal to", "<"),
    "==": ("equal to", ">="),
    "!=": ("different from", ">"),
}


@template(1)
def count_matching(r: random.Random) -> Spec:
    op, t = r.choice(list(COMPARISONS)), r.randint(-10, 10)
    phrase, near_miss = COMPARISONS[op]
    return Spec(
        "count_matching", "nums: list[int]", "int",
        f"Return how many elements of nums are {phrase} {t}.",
        f"return sum(1 for x in nums if x {op} {t})",
        f"return sum(1 for x in nums if x {near_miss} {t})",
        lambda r: (ints(r, t - 4, t + 4, 1, 10),),
    )  # fmt: skip


@template(1)
def count_letters(r: random.Random) -> Spec:
    a, b = sorted(letters(r, 2))
    ignore_case = r.random() < 0.5
    if ignore_case:
        doc = f"Return how many characters of s are '{a}' or '{b}', in upper or lower case."
        text, near_miss = "s.lower()", "s"
    else:
        doc = f"Return how many characters of s are '{a}' or '{b}' (lower case only)."
        text, near_miss = "s", "s.lower()"
    alphabet = a + b + a.upper() + b.upper() + "".join(letters(r, 2)) + "xY "
    return Spec(
        "count_letters", "s: str", "int", doc,
        f"return sum(1 for ch in {text} if ch in {a + b!r})",
        f"return sum(1 for ch in {near_miss} if ch in {a + b!r})",
        lambda r: (word(r, alphabet, 0, 12),),
    )  # fmt: skip


@template(1)
def replace_letter(r: random.Random) -> Spec:
    a, b = letters(r, 2)
    alphabet = a * 3 + b + "".join(letters(r, 2)) + " "
    return Spec(
        "replace_letter", "s: str", "str",
        f"Return s with every '{a}' replaced by '{b}'.",
        f"return s.replace({a!r}, {b!r})",
        f"return s.replace({a!r}, {b!r}, 1)",
        lambda r: (word(r, alphabet, 2, 12),),
    )  # fmt: skip


def polynomial(a: int, b: int, c: int, square: str = "x * x") -> str:
    terms = [f"{a} * {square}" if a != 1 else square]
    if b:
        terms.append(f"{'+' if b > 0 else '-'} {abs(b)} * x")
    if c:
        terms.append(f"{'+' if c > 0 else '-'} {abs(c)}")
    return " ".join(terms)


@template(1)
def quadratic(r: random.Random) -> Spec:
    a = r.choice([v for v in range(-9, 10) if v != 0])
    b, c = r.randint(-9, 9), r.randint(-9, 9)
    return Spec(
        "quadratic", "x: int", "int",
        f"Return the value of {polynomial(a, b, c)} at the integer x.",
        f"return {polynomial(a, b, c)}",
        f"return {polynomial(a, b, c, square='x * 2')}",
        lambda r: (r.randint(-30, 30),),
    )  # fmt: skip


WORD_PAIRS = [("Fizz", "Buzz"), ("Ping", "Pong"), ("Foo", "Bar"), ("Tic", "Tac"), ("Hop", "Skip")]


@template(1)
def fizz_words(r: random.Random) -> Spec:
    p, q = r.sample(range(2, 13), 2)
    w1, w2 = r.choice(WORD_PAIRS)
    both = math.lcm(p, q)
    body = f"""
        if n % {p} == 0 and n % {q} == 0:
            return {w1 + w2!r}
        if n % {p} == 0:
            return {w1!r}
        if n % {q} == 0:
            return {w2!r}
        return str(n)
    """
    wrong = f"""
        if n % {p} == 0:
            return {w1!r}
        if n % {q} == 0:
            return {w2!r}
        if n % {p} == 0 and n % {q} == 0:
            return {w1 + w2!r}
        return str(n)
    """
    return Spec(
        "fizz_words", "n: int", "str",
        f"Return '{w1}{w2}' when n is divisible by both {p} and {q}, '{w1}' when it is divisible"
        f" by {p} only, '{w2}' when by {q} only, else str(n).",
        body, wrong,
        lambda r: (r.choice([r.randint(1, 100), both * r.randint(1, 4)]),),
    )  # fmt: skip


@template(1)
def clamp_all(r: random.Random) -> Spec:
    lo = r.randint(-20, 10)
    hi = r.randint(lo + 1, lo + 20)
    return Spec(
        "clamp_all", "nums: list[int]", "list[int]",
        f"Return a new list in which every element of nums below {lo} becomes {lo} and every"
        f" element above {hi} becomes {hi}; the others stay as they are.",
        f"return [min(max(x, {lo}), {hi}) for x in nums]",
        f"return [min(x, {hi}) for x in nums]",
        lambda r: (ints(r, lo - 10, hi + 10),),
    )  # fmt: skip


@template(1)
def every_nth(r: random.Random) -> Spec:
    k = r.randint(2, 6)
    start = r.randrange(k)
    backwards = r.random() < 0.5
    order = "in reverse order" if backwards else "in order"
    tail = "[::-1]" if backwards else ""
    return Spec(
        "every_nth", "nums: list[int]", "list[int]",
        f"Return the elements of nums at indices {start}, {start + k}, {start + 2 * k}, … (every"
        f" {ordinal(k)} element from index {start}), {order}.",
        f"return nums[{start}::{k}]{tail}",
        f"return nums[{start + 1}::{k}]{tail}",
        lambda r: (ints(r, -9, 9, 0, 15),),
    )  # fmt: skip


@template(1)
def digit_power_sum(r: random.Random) -> Spec:
    base, power = r.randint(2, 16), r.randint(1, 3)
    loop = f"""
        total = 0
        while n $LOOP:
            total += (n % {base}) ** {power}
            n //= {base}
        return total
    """
    what = "digits" if power == 1 else f"{ordinal(power)} powers of the digits"
    return Spec(
        "digit_power_sum", "n: int", "int",
        f"Return the sum of the {what} of n written in base {base} (n >= 0).",
        loop.replace("$LOOP", "> 0"),
        loop.replace("$LOOP", f">= {base}"),
        lambda r: (r.randint(0, 5000),),
    )  # fmt: skip


@template(1)
def combine(r: random.Random) -> Spec:
    p, q = r.randint(1, 20), r.randint(1, 20)
    return Spec(
        "combine", "a: int, b: int", "int",
        f"Return {p} times a minus {q} times b.",
        f"return {p} * a - {q} * b",
        f"return {p} * a + {q} * b",
        lambda r: (r.randint(-50, 50), r.choice([r.randint(-50, -1), r.randint(1, 50)])),
    )  # fmt: skip


@template(1)
def count_long_words(r: random.Random) -> Spec:
    c, n = r.choice(string.ascii_lowercase), r.randint(1, 6)
    where = r.choice(["startswith", "endswith"])
    side = "start" if where == "startswith" else "end"

    def text(r: random.Random) -> tuple[str]:
        words = []
        for _ in range(r.randint(1, 8)):
            w = word(r, "abcdefgh", max(n - 2, 0), n)
            words.append(c + w if where == "startswith" else w + c)
        return (" ".join(words),)

    return Spec(
        "count_long_words", "text: str", "int",
        f"Return how many words of text (separated by spaces) {side} with '{c}' and are longer"
        f" than {n} characters.",
        f"return sum(1 for w in text.split() if w.{where}({c!r}) and len(w) > {n})",
        f"return sum(1 for w in text.split() if w.{where}({c!r}) and len(w) >= {n})",
        text,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Level 2: loops with a condition or an accumulator
# --------------------------------------------------------------------------------------------


@template(2)
def caesar(r: random.Random) -> Spec:
    k = r.randint(1, 25)
    upper = r.random() < 0.5
    upper_case = (
        f"""
            elif 'A' <= ch <= 'Z':
                out.append(chr((ord(ch) - 65 + {k}) % 26 + 65))"""
        if upper
        else ""
    )
    body = f"""
        out = []
        for ch in s:
            if 'a' <= ch <= 'z':
                out.append(chr((ord(ch) - 97 + {k}) % 26 + 97)){upper_case}
            else:
                out.append(ch)
        return ''.join(out)
    """
    wrong = body.replace("% 26 + 97", "+ 97").replace("% 26 + 65", "+ 65")
    which = "letter (keeping its case)" if upper else "lower-case letter"
    alphabet = string.ascii_letters + "09 "
    wraps = string.ascii_lowercase[26 - k :]  # letters whose shift goes past 'z'

    def text(r: random.Random) -> tuple[str]:
        s = word(r, alphabet, 1, 10)
        i = r.randint(0, len(s))
        return (s[:i] + r.choice(wraps) + s[i:],)

    return Spec(
        "caesar", "s: str", "str",
        f"Return s with every {which} shifted {k} places forward in the alphabet, wrapping"
        " around after 'z'; every other character unchanged.",
        body, wrong, text,
    )  # fmt: skip


@template(2)
def rotate(r: random.Random) -> Spec:
    k, right = r.randint(1, 9), r.random() < 0.5
    ahead, behind = "nums[-k:] + nums[:-k]", "nums[k:] + nums[:k]"
    rotated, near_miss = (ahead, behind) if right else (behind, ahead)
    loop = f"""
        if not nums:
            return []
        k = {k} % len(nums)
        return $ROTATED
    """
    example = "[3, 1, 2]" if right else "[2, 3, 1]"
    return Spec(
        "rotate", "nums: list[int]", "list[int]",
        f"Return nums rotated {'right' if right else 'left'} by {k} positions ({k} modulo"
        f" len(nums); an empty list stays empty): rotated by 1, [1, 2, 3] becomes {example}.",
        loop.replace("$ROTATED", rotated), loop.replace("$ROTATED", near_miss),
        lambda r: (ints(r, 0, 20, 0, 10),),
    )  # fmt: skip


def with_repeats(r: random.Random, nums: list[int]) -> list[int]:
    """``nums``, half of the time with its largest values repeated, in a shuffled order."""
    if nums and r.random() < 0.5:
        nums += sorted(nums)[-r.randint(1, len(nums)) :]
        r.shuffle(nums)
    return nums


@template(2)
def kth_largest(r: random.Random) -> Spec:
    k, default = r.randint(2, 4), r.randint(-100, 100)
    body = f"""
        values = sorted($VALUES, reverse=True)
        return values[{k - 1}] if len(values) >= {k} else {default}
    """
    return Spec(
        "kth_largest", "nums: list[int]", "int",
        f"Return the {ordinal(k)} largest distinct value of nums, or {default} when nums holds"
        f" fewer than {k} distinct values.",
        body.replace("$VALUES", "set(nums)"), body.replace("$VALUES", "nums"),
        lambda r: (with_repeats(r, ints(r, -5, 5, 0, 10)),),
    )  # fmt: skip


@template(2)
def run_length(r: random.Random) -> Spec:
    count_first, omit_ones = r.random() < 0.5, r.random() < 0.5
    sep = r.choice(["", "-", ","])
    count = "('' if count == 1 else str(count))" if omit_ones else "str(count)"
    piece = f"{count} + ch" if count_first else f"ch + {count}"
    body = f"""
        runs = []
        i = 0
        while i < len(s):
            j = i
            while j < len(s) and s[j] == s[i]:
                j += 1
            ch, count = s[i], j - i
            runs.append({piece})
            i = j
        return {sep!r}.join(runs)
    """
    wrong = f"""
        runs = []
        count = 1
        for i in range(1, len(s)):
            if s[i] == s[i - 1]:
                count += 1
            else:
                ch = s[i - 1]
                runs.append({piece})
                count = 1
        return {sep!r}.join(runs)
    """
    shape = "its count then the character" if count_first else "the character then its count"
    ones = " (a count of 1 is left out)" if omit_ones else ""
    return Spec(
        "run_length", "s: str", "str",
        f"Return the run-length encoding of s: each maximal run of one repeated character"
        f" written as {shape}{ones}, the runs joined by {sep!r}.",
        body, wrong,
        lambda r: (word(r, "aaabbc", 1, 12),),
    )  # fmt: skip


@template(2)
def filter_map(r: random.Random) -> Spec:
    m = r.randint(2, 7)
    rest, k, c = r.randrange(m), r.randint(1, 5), r.randint(-5, 5)
    return Spec(
        "filter_map", "nums: list[int]", "list[int]",
        f"Return, in order, {linear(k, c)} for every element x of nums with x % {m} == {rest}.",
        f"return [{linear(k, c)} for x in nums if x % {m} == {rest}]",
        f"return [{linear(k, c)} for x in nums if x % {m} != {rest}]",
        lambda r: (ints(r, -30, 30, 1, 10),),
    )  # fmt: skip


@template(2)
def neighbour_gap(r: random.Random) -> Spec:
    extreme, default = r.choice(["max", "min"]), r.randint(-5, 5)
    body = f"""
        if len(nums) < 2:
            return {default}
        return {extreme}($GAP for a, b in zip(nums, nums[1:]))
    """
    word_ = "largest" if extreme == "max" else "smallest"
    return Spec(
        "neighbour_gap", "nums: list[int]", "int",
        f"Return the {word_} absolute difference between two neighbouring elements of nums, or"
        f" {default} when nums has fewer than two elements.",
        body.replace("$GAP", "abs(a - b)"), body.replace("$GAP", "a - b"),
        lambda r: (ints(r, -20, 20, 0, 8),),
    )  # fmt: skip


@template(2)
def matching_words(r: random.Random) -> Spec:
    n, c = r.randint(2, 8), r.choice(string.ascii_lowercase)
    how = r.choice(["contain", "start with", "end with"])
    test = {"contain": f"{c!r} in w", "start with": f"w.startswith({c!r})",
            "end with": f"w.endswith({c!r})"}[how]  # fmt: skip
    alphabet = c * 2 + "".join(letters(r, 4))
    return Spec(
        "matching_words", "text: str", "list[str]",
        f"Return the words of text (separated by spaces), in order, that are at least {n}"
        f" characters long and {how} '{c}'.",
        f"return [w for w in text.split() if len(w) >= {n} and {test}]",
        f"return [w for w in text.split() if len(w) > {n} and {test}]",
        lambda r: (" ".join(word(r, alphabet, n - 1, n + 1) for _ in range(r.randint(1, 8))),),
    )  # fmt: skip


@template(2)
def digit_root(r: random.Random) -> Spec:
    product = r.random() < 0.5
    base = r.randint(3 if product else 2, 16)  # base 2: one product pass always ends it
    start, step = ("1", f"total *= n % {base}") if product else ("0", f"total += n % {base}")
    body = f"""
        $REPEAT n >= {base}:
            total = {start}
            while n > 0:
                {step}
                n //= {base}
            n = total
        return n
    """
    of = "product" if product else "sum"
    return Spec(
        "digit_root", "n: int", "int",
        f"Replace n by the {of} of its digits in base {base} until it is smaller than {base};"
        " return that value (n >= 0).",
        body.replace("$REPEAT", "while"), body.replace("$REPEAT", "if"),
        lambda r: (r.choice([r.randint(0, 100), r.randint(1000, 10**6)]),),
    )  # fmt: skip


@template(2)
def count_pairs(r: random.Random) -> Spec:
    t, op = r.randint(-20, 30), r.choice(["==", "<", ">"])
    loop = f"""
        count = 0
        for i in range(len(nums)):
            for j in range($FIRST, len(nums)):
                if nums[i] + nums[j] {op} {t}:
                    count += 1
        return count
    """
    half = t // 2
    return Spec(
        "count_pairs", "nums: list[int]", "int",
        f"Return the number of index pairs i < j with nums[i] + nums[j] {op} {t}.",
        loop.replace("$FIRST", "i + 1"), loop.replace("$FIRST", "0"),
        lambda r: (ints(r, half - 6, half + 6, 2, 8),),
    )  # fmt: skip


@template(2)
def to_base(r: random.Random) -> Spec:
    base, width = r.randint(2, 16), r.randint(1, 6)
    upper = base <= 10 or r.random() < 0.5
    digits = (string.digits + string.ascii_uppercase if upper else string.digits
              + string.ascii_lowercase)[:base]  # fmt: skip
    body = f"""
        out = ''
        while n > 0:
            out = $DIGITS
            n //= {base}
        return out.rjust({width}, '0')
    """
    case = "" if base <= 10 else f" (digits above 9 are letters: {digits[10]!r} for 10, …)"
    return Spec(
        "to_base", "n: int", "str",
        f"Return n (n >= 0) written in base {base}{case}, padded with leading zeros to at least"
        f" {width} characters.",
        body.replace("$DIGITS", f"{digits!r}[n % {base}] + out"),
        body.replace("$DIGITS", f"out + {digits!r}[n % {base}]"),
        lambda r: (r.choice([r.randint(0, 50), r.randint(base * base, 5000)]),),
    )  # fmt: skip


@template(2)
def distinct_at_least(r: random.Random) -> Spec:
    t, last = r.randint(-10, 10), r.random() < 0.5
    if last:
        body = f"""
            out = []
            for i, x in enumerate(nums):
                if x >= {t} and x not in nums[i + 1:]:
                    out.append(x)
            return out
        """
        where = "in the order of their last occurrences"
    else:
        body = f"""
            out = []
            for x in nums:
                if x >= {t} and x not in out:
                    out.append(x)
            return out
        """
        where = "in the order of their first occurrences"
    wrong = f"return sorted({{x for x in nums if x >= {t}}})"
    return Spec(
        "distinct_at_least", "nums: list[int]", "list[int]",
        f"Return the distinct values of nums that are at least {t}, {where}.",
        body, wrong,
        lambda r: (ints(r, t - 3, t + 5, 2, 10),),
    )  # fmt: skip


@template(2)
def window_values(r: random.Random) -> Spec:
    k, fn = r.randint(2, 5), r.choice(["max", "min", "sum"])
    what = {"max": "largest element", "min": "smallest element", "sum": "sum"}[fn]
    return Spec(
        "window_values", "nums: list[int]", "list[int]",
        f"Return the {what} of each window of {k} consecutive elements of nums, in order (an"
        f" empty list when nums has fewer than {k} elements).",
        f"return [{fn}(nums[i:i + {k}]) for i in range(len(nums) - {k - 1})]",
        f"return [{fn}(nums[i:i + {k}]) for i in range(len(nums) - {k})]",
        lambda r: (ints(r, -9, 9, 0, 10),),
    )  # fmt: skip


@template(2)
def bounded_totals(r: random.Random) -> Spec:
    cap, start = r.randint(5, 60), r.randint(0, 5)
    return Spec(
        "bounded_totals", "nums: list[int]", "list[int]",
        f"Start from {start} and add the elements of nums one by one, keeping the total between"
        f" 0 and {cap} (a step that would pass a bound stops at it); return the totals after each"
        " step.",
        f"""
            total = {start}
            out = []
            for x in nums:
                total = min(max(total + x, 0), {cap})
                out.append(total)
            return out
        """,
        f"""
            total = {start}
            out = []
            for x in nums:
                total += x
                out.append(min(max(total, 0), {cap}))
            return out
        """,
        lambda r: (ints(r, -25, 25, 2, 10),),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Level 3: small algorithms
# --------------------------------------------------------------------------------------------


@template(3)
def stairs(r: random.Random) -> Spec:
    steps = sorted(r.sample(range(1, 8), r.randint(2, 4)))
    modulus = r.choice([1000, 997, 10_007, 1_000_000_007])
    loop = f"""
        ways = [1] + [0] * n
        for i in range(1, n + 1):
            for step in {steps}:
                if i - step $REACH 0:
                    ways[i] += ways[i - step]
            ways[i] %= {modulus}
        return ways[n]
    """
    listed = ", ".join(map(str, steps[:-1])) + f" or {steps[-1]}"
    return Spec(
        "stairs", "n: int", "int",
        f"A staircase has n steps and each move climbs {listed} steps. Return the number of"
        f" different sequences of moves that end exactly on step n, modulo {modulus} (n >= 0;"
        " climbing 0 steps has one way).",
        loop.replace("$REACH", ">="), loop.replace("$REACH", ">"),
        lambda r: (r.randint(0, 60),),
    )  # fmt: skip


def fewest_coins(coins: tuple[int, ...], limit: int) -> list[int]:
    """For every amount below ``limit``, the fewest coins that make it (-1: none do)."""
    best = [0] + [-1] * (limit - 1)
    for value in range(1, limit):
        options = [best[value - c] for c in coins if c <= value and best[value - c] >= 0]
        best[value] = min(options) + 1 if options else -1
    return best


def greedy_coins(coins: tuple[int, ...], amount: int) -> int:
    count = 0
    for c in sorted(coins, reverse=True):
        count += amount // c
        amount %= c
    return count if amount == 0 else -1


@cache
def greedy_misses(coins: tuple[int, ...]) -> list[int]:
    """The amounts below 100 that greedy change-making gets wrong with these coins."""
    fewest = fewest_coins(coins, 100)
    return [a for a in range(100) if fewest[a] != greedy_coins(coins, a)]


@template(3)
def coin_change(r: random.Random) -> Spec:
    while True:  # coin sets on which greedy change-making goes wrong somewhere below 100
        coins = sorted(r.sample(range(2, 31), r.randint(2, 4)))
        tricky = greedy_misses(tuple(coins))
        if tricky:
            break
    return Spec(
        "coin_change", "amount: int", "int",
        f"Return the fewest coins of values {coins} (each value usable any number of times) that"
        " add up to exactly amount, or -1 when no combination does (amount >= 0).",
        f"""
            best = [0] + [-1] * amount
            for value in range(1, amount + 1):
                options = [best[value - c] for c in {coins} if c <= value and best[value - c] >= 0]
                best[value] = min(options) + 1 if options else -1
            return best[amount]
        """,
        f"""
            count = 0
            for c in {coins[::-1]}:
                count += amount // c
                amount %= c
            return count if amount == 0 else -1
        """,
        lambda r: (r.choice([r.randint(0, 99), r.choice(tricky)]),),
    )  # fmt: skip


@template(3)
def slices_with_sum(r: random.Random) -> Spec:
    m = r.randint(2, 9)
    if r.random() < 0.5:
        t = r.randint(-10, 25)
        test, what, hit = f"total == {t}", f"whose sum is {t}", t
    elif r.random() < 0.5:
        test, what, hit = f"total % {m} == 0", f"whose sum is divisible by {m}", m
    else:
        rest = r.randint(1, m - 1)
        test, what, hit = f"total % {m} == {rest}", f"whose sum leaves {rest} divided by {m}", rest

    def nums(r: random.Random) -> tuple[list[int]]:
        values = ints(r, -3, 6, 1, 9)
        if r.random() < 0.5:  # a slice of one element that counts
            values.insert(r.randint(0, len(values)), hit)
        return (values,)

    loop = f"""
        count = 0
        for i in range(len(nums)):
            total = 0
            for j in range(i, len(nums)):
                total += nums[j]
                if $LONG{test}:
                    count += 1
        return count
    """
    return Spec(
        "slices_with_sum", "nums: list[int]", "int",
        f"Return the number of non-empty contiguous slices nums[i:j] {what}.",
        loop.replace("$LONG", ""), loop.replace("$LONG", "j > i and "),
        nums,
    )  # fmt: skip


@template(3)
def longest_few_distinct(r: random.Random) -> Spec:
    k, substring = r.randint(1, 4), r.random() < 0.5
    returns, result = ("str", "s[start:start + best]") if substring else ("int", "best")
    loop = f"""
        best, start = 0, 0
        for i in range(len(s)):
            seen = set()
            for j in range(i, len(s)):
                seen.add(s[j])
                $STEP
        return {result}
    """
    check = f"if len(seen) > {k}:\n                    break"
    keep = "if j - i + 1 > best:\n                    best, start = j - i + 1, i"
    what = "the first longest such slice" if substring else "the length of the longest one"
    alphabet = string.ascii_lowercase[: k + 2]
    return Spec(
        "longest_few_distinct", "s: str", returns,
        f"Among the contiguous slices of s holding at most {k} distinct characters, return"
        f" {what} (s may be empty).",
        loop.replace("$STEP", f"{check}\n                {keep}"),
        loop.replace("$STEP", f"{keep}\n                {check}"),
        lambda r: (word(r, alphabet, 0, 12),),
    )  # fmt: skip


@template(3)
def nth_prime_in_class(r: random.Random) -> Spec:
    m = r.randint(2, 10)
    rest = r.choice([v for v in range(m) if math.gcd(v, m) == 1])
    above = r.randrange(0, 200, 10)
    loop = f"""
        p = {above}
        found = $FOUND
        while True:
            p += 1
            if p > 1 and p % {m} == {rest} and all(p % d for d in range(2, int(p ** 0.5) + 1)):
                found += 1
                if found == n:
                    return p
    """
    return Spec(
        "nth_prime_in_class", "n: int", "int",
        f"Return the n-th smallest prime p greater than {above} with p % {m} == {rest} (n >= 1;"
        " the 1st is the smallest).",
        loop.replace("$FOUND", "0"), loop.replace("$FOUND", "-1"),
        lambda r: (r.randint(1, 25),),
    )  # fmt: skip


@template(3)
def longest_chain(r: random.Random) -> Spec:
    lo = r.randint(0, 4)
    hi = r.randint(lo + 1, lo + 10)
    loop = """
        best = [1] * len(nums)
        for i in range(len(nums)):
            for j in range(i):
                if $RISE:
                    best[i] = max(best[i], best[j] + 1)
        return max(best, default=0)
    """
    return Spec(
        "longest_chain", "nums: list[int]", "int",
        f"Return the length of the longest subsequence of nums (elements in their order, not"
        f" necessarily adjacent) in which each element is larger than the previous one by at"
        f" least {lo} and at most {hi}.",
        loop.replace("$RISE", f"nums[j] + {lo} <= nums[i] <= nums[j] + {hi}"),
        loop.replace("$RISE", f"nums[j] + {lo} <= nums[i]"),
        lambda r: (ints(r, 0, 3 * hi + 10, 0, 10),),
    )  # fmt: skip


@template(3)
def edit_cost(r: random.Random) -> Spec:
    insert, delete, replace = r.randint(1, 3), r.randint(1, 3), r.randint(1, 3)
    loop = f"""
        cost = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(len(a) + 1):
            for j in range(len(b) + 1):
                if i == 0 or j == 0:
                    cost[i][j] = j * {insert} + i * {delete}
                else:
                    change = $CHANGE
                    cost[i][j] = min(cost[i - 1][j] + {delete}, cost[i][j - 1] + {insert},
                                     cost[i - 1][j - 1] + change)
        return cost[len(a)][len(b)]
    """
    return Spec(
        "edit_cost", "a: str, b: str", "int",
        f"Return the cheapest cost of turning a into b, where inserting a character costs"
        f" {insert}, deleting one costs {delete} and replacing one by another costs {replace}.",
        loop.replace("$CHANGE", f"0 if a[i - 1] == b[j - 1] else {replace}"),
        loop.replace("$CHANGE", str(replace)),
        lambda r: (word(r, "abc", 0, 6), word(r, "abc", 1, 6)),
    )  # fmt: skip


BRACKETS = [("(", ")"), ("[", "]"), ("{", "}"), ("<", ">")]


def bracket_text(r: random.Random, pairs: list[tuple[str, str]], spoils: list[str]) -> str:
    """Balanced text, or balanced text spoiled (one of ``spoils``, or none): reversed, rotated
    by one, with an opener too many, or with one closer swapped."""

    def nest(depth: int) -> str:
        parts = []
        for _ in range(r.randint(0, 3 if depth < 3 else 0)):
            o, c = r.choice(pairs)
            parts.append(o + nest(depth + 1) + c + r.choice(["", "x"]))
        return "".join(parts)

    text = nest(0) or "".join(pairs[0])
    spoil = r.choice(["none", *spoils])
    if spoil == "reverse":
        return text[::-1]
    if spoil == "rotate":
        return text[1:] + text[0]
    if spoil == "open":
        return r.choice(pairs)[0] + text
    if spoil == "swap" and len(pairs) > 1:
        closers = [c for _, c in pairs]
        i = max(i for i, ch in enumerate(text) if ch in closers)
        return text[:i] + r.choice([c for c in closers if c != text[i]]) + text[i + 1 :]
    return text


@template(3)
def brackets(r: random.Random) -> Spec:
    pairs = sorted(r.sample(BRACKETS, r.randint(1, 4)), key=BRACKETS.index)
    depth = r.random() < 0.5
    opener = {c: o for o, c in pairs}
    scan = f"""
        stack = []
        deepest = 0
        for ch in s:
            if ch in {"".join(o for o, _ in pairs)!r}:
                stack.append(ch)
                deepest = max(deepest, len(stack))
            elif ch in {opener!r}:
                if not stack or stack[-1] != {opener!r}[ch]:
                    return {-1 if depth else False}
                stack.pop()
        return $RESULT
    """
    listed = " ".join(o + c for o, c in pairs)
    if depth:
        doc = (f"Return the deepest nesting of the brackets {listed} in s (0 when there are"
               " none), or -1 when they are not balanced and properly nested. Other characters"
               " are ignored.")  # fmt: skip
        body = scan.replace("$RESULT", "deepest if not stack else -1")
        wrong = scan.replace("$RESULT", "deepest")
        spoils = ["open", "open", "reverse", "swap"]
    else:
        doc = (f"Return True when the brackets {listed} in s are balanced and properly nested,"
               " else False. Other characters are ignored.")  # fmt: skip
        body = scan.replace("$RESULT", "not stack")
        wrong = f"return all(s.count(o) == s.count(c) for o, c in {pairs!r})"
        spoils = ["reverse", "rotate", "open", "swap"]
    return Spec(
        "brackets", "s: str", "int" if depth else "bool", doc, body, wrong,
        lambda r: (bracket_text(r, pairs, spoils),),
    )  # fmt: skip


@template(3)
def merge_intervals(r: random.Random) -> Spec:
    touching = r.random() < 0.5
    result = r.choice(["list", "count", "length"])
    overlap = "<=" if touching else "<"
    returns = {"list": "list[tuple[int, int]]", "count": "int", "length": "int"}[result]
    give = {"list": "merged", "count": "len(merged)",
            "length": "sum(end - start for start, end in merged)"}[result]  # fmt: skip
    loop = f"""
        merged = []
        for start, end in sorted(intervals):
            if merged and start $JOIN merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return {give}
    """
    what = {
        "list": "the merged intervals as (start, end) tuples, sorted by start",
        "count": "how many intervals are left",
        "length": "the total length they cover",
    }
    join = "overlap or touch (one ends where the next starts)" if touching else "overlap"
    near_miss = ("<" if touching else "<=") if result != "length" else "=="

    def spans(r: random.Random) -> tuple[list[tuple[int, int]]]:
        out = []
        for _ in range(r.randint(1, 6)):
            a = r.randint(0, 20)
            out.append((a, a + r.randint(1, 5)))
        return (out,)

    return Spec(
        "merge_intervals", "intervals: list[tuple[int, int]]", returns,
        f"Each interval (start, end) has start < end. Merge every two intervals that {join},"
        f" repeatedly, and return {what[result]}.",
        loop.replace("$JOIN", overlap), loop.replace("$JOIN", near_miss),
        spans,
    )  # fmt: skip


@template(3)
def most_frequent(r: random.Random) -> Spec:
    k, larger, least = r.randint(1, 4), r.random() < 0.5, r.random() < 0.5
    count = "counts[x]" if least else "-counts[x]"
    key = f"({count}, -x)" if larger else f"({count}, x)"
    loop = f"""
        counts = {{}}
        for x in nums:
            counts[x] = counts.get(x, 0) + 1
        return sorted(counts, key=lambda x: $KEY)[:{k}]
    """
    most = "least" if least else "most"
    tie = "larger" if larger else "smaller"
    return Spec(
        "frequent_values", "nums: list[int]", "list[int]",
        f"Return the {k} values that occur {most} often in nums, the {most} frequent first and"
        f" ties broken by the {tie} value first (all the distinct values when there are fewer"
        f" than {k}).",
        loop.replace("$KEY", key), loop.replace("$KEY", count),
        tied_counts,
    )  # fmt: skip


def tied_counts(r: random.Random) -> tuple[list[int]]:
    """A shuffled list whose values occur c or c + 1 times: ties at the top are the rule."""
    c = r.randint(1, 3)
    nums = [x for x in r.sample(range(10), r.randint(1, 6)) for _ in range(c + r.randint(0, 1))]
    r.shuffle(nums)
    return (nums,)
