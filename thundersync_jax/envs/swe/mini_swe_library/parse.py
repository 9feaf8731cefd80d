"""Library module `parse`: parsers of small text formats (key=value, ints, CSV, ranges, m:ss)."""

from thundersync_jax.envs.swe.mini_swe_library._types import func

PARSE = (
    func(
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
    func(
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
    func(
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
    func(
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
    func(
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
    func(
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
