"""The code mini-SWE tasks are made of: small real functions, their bugs, their checks.

Each `Func` is a short, correct function; each `Bug` is a one-token mutation
of one of its lines (wrong operator, off-by-one, wrong default, swapped
arguments, missing edge case); each check is a call and its correct value,
written into the generated tests as `assert CALL == EXPECTED`. Which checks a
bug breaks is computed by running the buggy function (see mini_swe.py), so no
expectation here is hand-derived from a bug.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Bug:
    """Replace `fixed` (unique in the function) with `buggy`; `kind` names the bug class."""

    fixed: str
    buggy: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Func:
    """A correct function, the bugs that can be injected into it, and (call, expected) checks."""

    name: str
    source: str
    bugs: tuple[Bug, ...]
    checks: tuple[tuple[str, str], ...]


def _f(name: str, source: str, bugs: list[tuple[str, str, str]], checks: list[tuple[str, str]]):
    return Func(name, source.strip("\n") + "\n", tuple(Bug(*b) for b in bugs), tuple(checks))


STRS = (
    _f(
        "title",
        """
def title(s):
    return " ".join(w[:1].upper() + w[1:] for w in s.split())
""",
        [("w[1:]", "w[2:]", "off-by-one"), ("w[:1].upper()", "w[:1].lower()", "wrong call")],
        [('title("ab cd")', '"Ab Cd"'), ('title("x")', '"X"'), ('title("hi yo")', '"Hi Yo"')],
    ),
    _f(
        "vowels",
        """
def vowels(s):
    return sum(1 for c in s.lower() if c in "aeiou")
""",
        [('"aeiou"', '"aeio"', "missing edge case"), ("if c in", "if c not in", "negation")],
        [
            ('vowels("Hello")', "2"),
            ('vowels("you")', "2"),
            ('vowels("xyz")', "0"),
            ('vowels("AEIOU")', "5"),
        ],
    ),
    _f(
        "pad",
        """
def pad(s, n, ch=" "):
    return ch * (n - len(s)) + s
""",
        [("n - len(s)", "n + len(s)", "wrong operator"), ('ch=" "', 'ch="0"', "wrong default")],
        [
            ('pad("ab", 4, ".")', '"..ab"'),
            ('pad("abc", 2)', '"abc"'),
            ('pad("7", 3)', '"  7"'),
            ('pad("x", 2)', '" x"'),
        ],
    ),
    _f(
        "cut",
        """
def cut(s, n):
    if len(s) <= n:
        return s
    return s[: n - 1] + "~"
""",
        [("len(s) <= n", "len(s) < n", "off-by-one"), ("s[: n - 1]", "s[: n + 1]", "off-by-one")],
        [
            ('cut("abc", 3)', '"abc"'),
            ('cut("abcdef", 4)', '"abc~"'),
            ('cut("hello", 2)', '"h~"'),
            ('cut("ab", 2)', '"ab"'),
        ],
    ),
    _f(
        "snake",
        """
def snake(s):
    out = ""
    for c in s:
        if c.isupper():
            out += "_" + c.lower()
        else:
            out += c
    return out
""",
        [
            ("c.isupper()", "c.islower()", "wrong call"),
            ('"_" + c.lower()', '"-" + c.lower()', "wrong constant"),
        ],
        [('snake("fooBar")', '"foo_bar"'), ('snake("aBC")', '"a_b_c"'), ('snake("x")', '"x"')],
    ),
    _f(
        "is_pal",
        """
def is_pal(s):
    t = [c.lower() for c in s if c.isalnum()]
    return t == t[::-1]
""",
        [("c.lower()", "c", "missing edge case"), ("c.isalnum()", "c.isalpha()", "wrong call")],
        [
            ('is_pal("Aba")', "True"),
            ('is_pal("Race car")', "True"),
            ('is_pal("ab")', "False"),
            ('is_pal("1a2")', "False"),
            ('is_pal("a1b2a")', "False"),
        ],
    ),
)

NUMS = (
    _f(
        "clamp",
        """
def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
""",
        [("x > hi", "x < hi", "wrong operator"), ("return lo", "return hi", "swapped names")],
        [
            ("clamp(5, 0, 3)", "3"),
            ("clamp(-1, 0, 3)", "0"),
            ("clamp(2, 0, 3)", "2"),
            ("clamp(9, 1, 4)", "4"),
            ("clamp(-5, -2, 2)", "-2"),
        ],
    ),
    _f(
        "mean",
        """
def mean(xs):
    if not xs:
        return 0.0
    return sum(xs) / len(xs)
""",
        [
            ("sum(xs) / len(xs)", "sum(xs) // len(xs)", "wrong operator"),
            ("if not xs:", "if xs:", "negation"),
        ],
        [
            ("mean([1, 2])", "1.5"),
            ("mean([2, 4])", "3"),
            ("mean([])", "0.0"),
            ("mean([1, 4])", "2.5"),
        ],
    ),
    _f(
        "digsum",
        """
def digsum(n):
    n = abs(n)
    total = 0
    while n > 0:
        total += n % 10
        n //= 10
    return total
""",
        [("n > 0", "n > 9", "off-by-one"), ("abs(n)", "int(n)", "missing edge case")],
        [
            ("digsum(123)", "6"),
            ("digsum(-45)", "9"),
            ("digsum(0)", "0"),
            ("digsum(7)", "7"),
            ("digsum(-8)", "8"),
        ],
    ),
    _f(
        "gcd",
        """
def gcd(a, b):
    while b:
        a, b = b, a % b
    return abs(a)
""",
        [
            ("return abs(a)", "return abs(b)", "swapped names"),
            ("while b:", "while a:", "wrong name"),
        ],
        [("gcd(12, 8)", "4"), ("gcd(7, 0)", "7"), ("gcd(0, 0)", "0"), ("gcd(9, 6)", "3")],
    ),
    _f(
        "pct",
        """
def pct(part, whole, digits=1):
    return round(100 * part / whole, digits)
""",
        [
            ("digits=1", "digits=0", "wrong default"),
            ("part / whole", "whole / part", "swapped args"),
        ],
        [
            ("pct(1, 3)", "33.3"),
            ("pct(1, 2)", "50.0"),
            ("pct(2, 3)", "66.7"),
            ("pct(1, 3, 2)", "33.33"),
        ],
    ),
    _f(
        "is_prime",
        """
def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True
""",
        [("i * i <= n", "i * i < n", "off-by-one"), ("n < 2", "n < 1", "off-by-one")],
        [
            ("is_prime(9)", "False"),
            ("is_prime(7)", "True"),
            ("is_prime(25)", "False"),
            ("is_prime(1)", "False"),
            ("is_prime(2)", "True"),
            ("is_prime(1.5)", "False"),
        ],
    ),
)

LISTS = (
    _f(
        "chunk",
        """
def chunk(xs, n):
    return [xs[i : i + n] for i in range(0, len(xs), n)]
""",
        [
            ("range(0, len(xs), n)", "range(1, len(xs), n)", "off-by-one"),
            ("xs[i : i + n]", "xs[i : i + 1]", "wrong name"),
        ],
        [
            ("chunk([1, 2, 3], 2)", "[[1, 2], [3]]"),
            ("chunk([], 2)", "[]"),
            ("chunk([1, 2, 3, 4], 2)", "[[1, 2], [3, 4]]"),
            ("chunk([5], 1)", "[[5]]"),
        ],
    ),
    _f(
        "last",
        """
def last(xs, default=None):
    return xs[-1] if xs else default
""",
        [("xs[-1]", "xs[0]", "wrong index"), ("if xs else", "if not xs else", "negation")],
        [
            ("last([1, 2, 3])", "3"),
            ("last([], 0)", "0"),
            ("last([5])", "5"),
            ('last(["a", "b"])', '"b"'),
        ],
    ),
    _f(
        "dedup",
        """
def dedup(xs):
    seen = set()
    out = []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
""",
        [("if x not in seen", "if x in seen", "negation")],
        [("dedup([1, 1, 2])", "[1, 2]"), ("dedup([])", "[]"), ("dedup([3, 1, 3])", "[3, 1]")],
    ),
    _f(
        "winsum",
        """
def winsum(xs, k):
    return [sum(xs[i : i + k]) for i in range(len(xs) - k + 1)]
""",
        [
            ("len(xs) - k + 1", "len(xs) - k", "off-by-one"),
            ("xs[i : i + k]", "xs[i : i + k - 1]", "off-by-one"),
        ],
        [
            ("winsum([1, 2, 3], 2)", "[3, 5]"),
            ("winsum([1, 2], 2)", "[3]"),
            ("winsum([4], 1)", "[4]"),
            ("winsum([], 1)", "[]"),
        ],
    ),
    _f(
        "rotate",
        """
def rotate(xs, k):
    if not xs:
        return []
    k %= len(xs)
    return xs[k:] + xs[:k]
""",
        [
            ("if not xs:", "if xs:", "negation"),
            ("xs[k:] + xs[:k]", "xs[:k] + xs[k:]", "swapped args"),
        ],
        [
            ("rotate([1, 2, 3], 1)", "[2, 3, 1]"),
            ("rotate([], 3)", "[]"),
            ("rotate([1, 2], 2)", "[1, 2]"),
            ("rotate([1, 2, 3], 5)", "[3, 1, 2]"),
        ],
    ),
    _f(
        "argmax",
        """
def argmax(xs):
    best = 0
    for i in range(1, len(xs)):
        if xs[i] > xs[best]:
            best = i
    return best
""",
        [
            ("xs[i] > xs[best]", "xs[i] < xs[best]", "wrong operator"),
            ("range(1, len(xs))", "range(1, len(xs) - 1)", "off-by-one"),
        ],
        [
            ("argmax([1, 3, 2])", "1"),
            ("argmax([5])", "0"),
            ("argmax([2, 9, 4, 7])", "1"),
            ("argmax([1, 5])", "1"),
            ("argmax([1, 2, 3])", "2"),
        ],
    ),
)

PARSE = (
    _f(
        "kv",
        """
def kv(s):
    out = {}
    for part in s.split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out
""",
        [
            ('part.split("=", 1)', 'part.split("=", 2)', "wrong constant"),
            ("out[k.strip()]", "out[k]", "missing edge case"),
        ],
        [
            ('kv("a=1;b=2")', '{"a": "1", "b": "2"}'),
            ('kv("x=a=b")', '{"x": "a=b"}'),
            ('kv("a=1; b=2")', '{"a": "1", "b": "2"}'),
            ('kv(" q = 1")', '{"q": "1"}'),
            ('kv("u=1;v=2=3")', '{"u": "1", "v": "2=3"}'),
        ],
    ),
    _f(
        "to_int",
        """
def to_int(s, default=0):
    try:
        return int(s.strip())
    except ValueError:
        return default
""",
        [
            ("default=0", "default=1", "wrong default"),
            ("except ValueError", "except TypeError", "wrong exception"),
        ],
        [
            ('to_int("x")', "0"),
            ('to_int("")', "0"),
            ('to_int(" 42 ")', "42"),
            ('to_int("7")', "7"),
            ('to_int("5\\n")', "5"),
            ('to_int("?", 3)', "3"),
        ],
    ),
    _f(
        "fields",
        """
def fields(line):
    return [f.strip() for f in line.split(",") if f.strip()]
""",
        [
            ("if f.strip()]", "if f]", "missing edge case"),
            ('line.split(",")', 'line.split(";")', "wrong constant"),
        ],
        [
            ('fields("a, ,b")', '["a", "b"]'),
            ('fields("a,b,")', '["a", "b"]'),
            ('fields(" , x")', '["x"]'),
            ('fields("")', "[]"),
        ],
    ),
    _f(
        "span",
        """
def span(s):
    lo, hi = s.split("-")
    return list(range(int(lo), int(hi) + 1))
""",
        [
            ("int(hi) + 1", "int(hi)", "off-by-one"),
            ("range(int(lo)", "range(int(hi)", "swapped names"),
        ],
        [('span("3-6")', "[3, 4, 5, 6]"), ('span("2-2")', "[2]"), ('span("0-1")', "[0, 1]")],
    ),
    _f(
        "secs",
        """
def secs(s):
    m, sec = s.split(":")
    return int(m) * 60 + int(sec)
""",
        [
            ("int(m) * 60", "int(m) * 100", "wrong constant"),
            ("m, sec =", "sec, m =", "swapped names"),
        ],
        [
            ('secs("1:30")', "90"),
            ('secs("0:05")', "5"),
            ('secs("2:00")', "120"),
            ('secs("0:00")', "0"),
        ],
    ),
    _f(
        "flag",
        """
def flag(s):
    return s.strip().lower() in ("1", "true", "yes", "on")
""",
        [
            ("s.strip().lower()", "s.strip()", "missing edge case"),
            (' in ("1"', ' not in ("1"', "negation"),
        ],
        [
            ('flag("True")', "True"),
            ('flag("yes")', "True"),
            ('flag("no")', "False"),
            ('flag("YES")', "True"),
            ('flag(" 1 ")', "True"),
        ],
    ),
)

# module name (under the package) -> its functions
MODULES: dict[str, tuple[Func, ...]] = {"strs": STRS, "nums": NUMS, "lists": LISTS, "parse": PARSE}
