"""Library module `nums`: number helpers (clamp, mean, digit sum, gcd, percentages, primality)."""

from thundersync_jax.envs.swe.mini_swe_library._types import func

NUMS = (
    func(
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
    func(
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
    func(
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
    func(
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
    func(
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
    func(
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
