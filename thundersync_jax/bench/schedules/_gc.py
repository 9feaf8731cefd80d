"""Python's cyclic garbage collector kept out of the timed passes.

A full collection walks every tracked object of the process (~240k with JAX,
Flax and transformers loaded): ~125 ms on the dev VM, 20% of a benchmark step.
Whichever pass crosses the collector's threshold pays it, and in the schedule
benchmark that was the replay in about half the rounds and the calibration
almost never (measured: every replay that held a ~125 ms chunk also held a
generation-2 collection), so predictions came out one-sidedly short. As
`timeit` does, each timed pass runs with the collector off, after a collection
outside the timing; `frozen_heap` moves the objects alive after setup out of
the collector's sight, so those collections cost milliseconds, not a tenth of a
second.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Collects garbage now, then keeps the cyclic collector off until the block ends."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Everything alive now is left out of collections until the block ends (`gc.freeze`)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
