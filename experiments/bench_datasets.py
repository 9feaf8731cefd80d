r"""Loading and image resolution of a generated SWE-smith-format dataset (BENCHMARKS.md).

    python -m experiments.bench_datasets [--rows=10000] [--images=300] [--repeats=3]

Writes `--rows` SWE-smith rows (a one-line bug patch, FAIL_TO_PASS / PASS_TO_PASS lists,
`image_name` cycling over `--images` names) as parquet, and an image store holding one tiny
`docker save` tarball per name; then times, in this process, reading the rows
(`dataset.read_rows`) and the whole `dataset.load` (rows checked, gold patches reversed,
every image resolved) with the store's tag index cold (first scan) and warm (cached in
DIR/.tsj-tags.json). Prints one JSON line per measurement (medians over the repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from thundersync_jax.envs.images import build, store
from thundersync_jax.envs.swe import dataset


def make(root: str, rows: int, images: int) -> tuple[str, str]:
    """(parquet path, image store) of the generated dataset."""
    names = [f"org/swesmith.x86_64.repo{i}.{i:08x}" for i in range(images)]
    data = []
    for i in range(rows):
        bug = (f"diff --git a/m{i}.py b/m{i}.py\n--- a/m{i}.py\n+++ b/m{i}.py\n"
               f"@@ -1,2 +1,2 @@\n-x = {i}\n+x = {i + 1}\n y = 0\n")  # fmt: skip
        data.append(dict(
            instance_id=f"org__repo{i % images}.{i}", repo=f"org/repo{i % images}", patch=bug,
            FAIL_TO_PASS=[f"tests/test_m.py::test_{i}"],
            PASS_TO_PASS=[f"tests/test_m.py::test_ok_{j}" for j in range(5)],
            image_name=names[i % images], problem_statement=f"m{i}.x is off by one",
        ))  # fmt: skip
    path = os.path.join(root, "smith.parquet")
    pq.write_table(pa.Table.from_pylist(data), path)
    layer = build.write_layer([build.file_bytes("etc/hi", b"hi")], root)
    config = build.image_config([layer], {})
    images_dir = os.path.join(root, "images")
    os.makedirs(images_dir)
    for i, name in enumerate(names):
        build.write_docker_archive(os.path.join(images_dir, f"{i}.tar"), [layer], config, name)
    return path, images_dir


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=10000)
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-datasets-") as root:
        path, images = make(root, args.rows, args.images)
        index = os.path.join(images, store.INDEX_FILE)

        def cold():
            if os.path.exists(index):
                os.remove(index)
            dataset.load(path, images=images)

        dataset.load(path, images=images)  # warm-up: imports, page cache
        results = {
            "read_rows_s": _timed(lambda: dataset.read_rows(path), args.repeats),
            "load_cold_index_s": _timed(cold, args.repeats),
            "load_warm_index_s": _timed(lambda: dataset.load(path, images=images), args.repeats),
        }
        n = len(dataset.load(path, images=images))
        for name, seconds in results.items():
            print(json.dumps(dict(measure=name, seconds=round(seconds, 3), rows=n,
                                  images=args.images)))  # fmt: skip


if __name__ == "__main__":
    main()
