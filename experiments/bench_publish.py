r"""Weight publication latency vs a plain memory copy of the same bytes.

    python -m experiments.bench_publish [--target_mib=128] [--repeats=10] [--warmup=2]

Publishes a ~128 MiB float32 Qwen3 to one real rollout engine process (Orbax snapshot in
/dev/shm through our SnapshotHandler, engine load, acknowledgement) and prints one JSON line:
medians over `repeats` publications after `warmup`, for a "warm" series (the learner fills a
file prepared in the background since the previous publication, as EngineManager.publish does)
and a "cold" one (a new file per publication), each with `ratio` = publication bandwidth /
memory-copy bandwidth (target >= 0.25); the top-level `ratio` is the warm series'.
"""

import json

from absl import app, flags

from thundersync_jax.bench import publish as bench

_TARGET_MIB = flags.DEFINE_integer("target_mib", 128, "Approximate parameter MiB (float32).")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Measured publications (median reported).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Publications before measuring.")
_BASE = flags.DEFINE_string("base", "/dev/shm/thundersync", "Snapshot base directory.")


def main(argv):
    del argv
    result = bench.measure_publication(
        _TARGET_MIB.value, _REPEATS.value, _WARMUP.value, _BASE.value
    )
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
