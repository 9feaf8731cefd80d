"""The records a mini-SWE library function is made of: the function, its bugs, its checks."""

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


def func(
    name: str, source: str, bugs: list[tuple[str, str, str]], checks: list[tuple[str, str]]
) -> Func:
    """A `Func` from literal pieces: blank lines around the source dropped, bug triples unpacked."""
    return Func(name, source.strip("\n") + "\n", tuple(Bug(*b) for b in bugs), tuple(checks))
