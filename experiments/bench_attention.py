r"""Blockwise attention's cost per tile size on the tiny CPU Qwen3's head layout.

    python -m experiments.bench_attention --out=runs/bench_attention.json

Prints a markdown table of the median gradient time per (length, largest tile), with the tile
each length is cut into in parentheses: the figures behind `model.attention_block` (256 on
the CPU configs, BENCHMARKS.md "Long sequences"). About a minute on 2 CPU cores.
"""

from __future__ import annotations

from absl import app, flags

from configs import common
from experiments import _output
from thundersync_jax.bench import attention_tiles

_OUT = flags.DEFINE_string("out", "", "write the result as JSON here (optional)")
_LENGTHS = flags.DEFINE_list("lengths", ["1023", "1119", "1535"], "sequence lengths")
_TILES = flags.DEFINE_list("tiles", ["128", "256", "384", "512"], "largest tiles")
_ROWS = flags.DEFINE_integer("rows", 1, "sequences per call (the learner scores one per chunk)")
_REPEATS = flags.DEFINE_integer("repeats", 7, "timed calls per cell (median taken)")


def main(argv):
    del argv
    result = attention_tiles.run(
        common.tiny_qwen3_model(),
        lengths=[int(x) for x in _LENGTHS.value],
        tiles=[int(x) for x in _TILES.value],
        rows=_ROWS.value,
        repeats=_REPEATS.value,
    )
    _output.show(attention_tiles.markdown(result), result, _OUT.value)


if __name__ == "__main__":
    app.run(main)
