r"""Fixed vs per-token cost of score-gradient chunks on the tiny CPU Qwen3.

    python -m experiments.bench_chunks --out=runs/bench_chunks.json

Prints a markdown table of median wall time per one-row chunk (32..1024 tokens, after
warm-up) and the least-squares fit time = fixed + per_token · tokens; the target is a fixed
cost of at most 5% of a 256-token chunk's time. Takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

from absl import app, flags

from configs import common
from experiments import _output
from thundersync_jax.bench import chunks as chunk_bench

_OUT = flags.DEFINE_string("out", "", "write the result as JSON here (optional)")
_LENGTHS = flags.DEFINE_list("lengths", ["32", "64", "128", "256", "512", "1024"], "chunk lengths")
_REPEATS = flags.DEFINE_integer("repeats", 20, "timed calls per length (median taken)")


def main(argv):
    del argv
    result = chunk_bench.run(
        common.tiny_qwen3_model(), lengths=[int(x) for x in _LENGTHS.value], repeats=_REPEATS.value
    )
    _output.show(chunk_bench.markdown(result), result, _OUT.value)


if __name__ == "__main__":
    app.run(main)
