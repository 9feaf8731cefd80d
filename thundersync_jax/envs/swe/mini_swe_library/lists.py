"""Library module `lists`: list helpers (chunking, last, dedup, window sums, rotation, argmax)."""

from thundersync_jax.envs.swe.mini_swe_library._types import func

LISTS = (
    func(
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
    func(
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
    func(
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
    func(
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
    func(
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
    func(
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
