"""Library module `strs`: string helpers (title case, vowels, padding, snake case, palindromes)."""

from thundersync_jax.envs.swe.mini_swe_library._types import func

STRS = (
    func(
        "title",
        """
def title(s):
    return " ".join(w[:1].upper() + w[1:] for w in s.split())
""",
        [("w[1:]", "w[2:]", "off-by-one"), ("w[:1].upper()", "w[:1].lower()", "wrong call")],
        [('title("ab cd")', '"Ab Cd"'), ('title("x")', '"X"'), ('title("hi yo")', '"Hi Yo"')],
    ),
    func(
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
    func(
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
    func(
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
    func(
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
    func(
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
