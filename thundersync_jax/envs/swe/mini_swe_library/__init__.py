"""The code mini-SWE tasks are made of: small real functions, their bugs, their checks.

Each `Func` is a short, correct function; each `Bug` is a one-token mutation
of one of its lines (wrong operator, off-by-one, wrong default, swapped
arguments, missing edge case); each check is a call and its correct value,
written into the generated tests as `assert CALL == EXPECTED`. Which checks a
bug breaks is computed by running the buggy function (see mini_swe.py), so no
expectation here is hand-derived from a bug.

One submodule per library module of the generated package (strs, nums, lists, parse).
"""

from thundersync_jax.envs.swe.mini_swe_library._types import Bug, Func
from thundersync_jax.envs.swe.mini_swe_library.lists import LISTS
from thundersync_jax.envs.swe.mini_swe_library.nums import NUMS
from thundersync_jax.envs.swe.mini_swe_library.parse import PARSE
from thundersync_jax.envs.swe.mini_swe_library.strs import STRS

# module name (under the package) -> its functions
MODULES: dict[str, tuple[Func, ...]] = {"strs": STRS, "nums": NUMS, "lists": LISTS, "parse": PARSE}

__all__ = ["LISTS", "MODULES", "NUMS", "PARSE", "STRS", "Bug", "Func"]
