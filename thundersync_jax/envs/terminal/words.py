"""Pseudo-words and filler text from syllables: task data that needs no download.

Every draw goes through the caller's seeded `random.Random`, so a task is a function of its
seed; the order of draws is part of that function (changing it changes every task).
"""

from __future__ import annotations

import random

_SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "zu", "pel", "dor", "fin", "gra", "hul", "sen")


def word(rng: random.Random) -> str:
    """A pseudo-word of two or three syllables."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))


def words(rng: random.Random, n: int) -> list[str]:
    """`n` distinct pseudo-words, in the order drawn."""
    seen: list[str] = []
    while len(seen) < n:
        w = word(rng)
        if w not in seen:
            seen.append(w)
    return seen


def text_lines(rng: random.Random, lines: int, vocab: list[str]) -> str:
    """`lines` lines of 4 to 9 words drawn from `vocab`, each ending in a newline."""
    return "".join(" ".join(rng.choices(vocab, k=rng.randint(4, 9))) + "\n" for _ in range(lines))
