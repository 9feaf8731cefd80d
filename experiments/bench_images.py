"""Issue 17 figures: SWE instances in their own images vs the host toolchain.

    python -m experiments.bench_images --workdir=DIR [--tasks=12] [--repeats=10] [--workers=2]

On the shipped task family (mini-SWE, easy/medium/hard alternating) it measures, side by
side in one run: building one image per repository (`images build`), the first unpack
of an image (cold cache: the shared interpreter layers, then one repository layer) and
of a second image that shares the lower layers, a cached lease, a sandbox's first
command on the host vs in the image, an episode reset (fresh workspace + sandbox) on the
host vs in the image, and `swe_eval` with the gold patches (all must resolve) on the
host vs in the images. Medians over `repeats` after one warm-up. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

from thundersync_jax.envs import swe_eval
from thundersync_jax.envs.images import __main__ as images_cli
from thundersync_jax.envs.images import cache as cache_lib
from thundersync_jax.envs.sandbox import Sandbox
from thundersync_jax.envs.swe import instance as instance_lib
from thundersync_jax.envs.swe import mini_swe
from thundersync_jax.envs.swe.environment import SweEnvironment


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _box_start(root: str, cache: cache_lib.ImageCache, image: str | None):
    def run():
        if image is None:
            with Sandbox(root) as sb:
                assert sb.run("true").exit_code == 0
        else:
            with cache.lease(image) as img, Sandbox(root, rootfs=img.rootfs, env=img.env) as sb:
                assert sb.run("true").exit_code == 0

    return run


def _reset(inst, workdir: str, cache: cache_lib.ImageCache):
    def run():
        env = SweEnvironment(inst, workdir, {"timeout_s": 60}, image_cache=cache)
        try:
            env.reset()
        finally:
            env.close()

    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workdir", required=True)
    p.add_argument("--tasks", type=int, default=12)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    wd = os.path.abspath(args.workdir)
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    tasks = mini_swe.generate(args.tasks, 0, os.path.join(wd, "mini_swe"), mini_swe.DIFFICULTIES)
    host_jsonl = os.path.join(wd, "host.jsonl")
    instance_lib.dump_jsonl(tasks, host_jsonl)
    out = {"tasks": len(tasks)}

    start = time.perf_counter()
    image_jsonl = images_cli.build_from_instances(host_jsonl, os.path.join(wd, "images"))
    out["build_s"] = time.perf_counter() - start
    in_image = instance_lib.load_jsonl(image_jsonl)
    first, second = in_image[0].image, in_image[1].image
    out["image_stored_mb"] = (
        sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(first) for f in fs) / 1e6
    )

    cache = cache_lib.ImageCache(os.path.join(wd, "cache"))
    out["first_unpack_s"] = cache.unpack(first).seconds
    got = cache.unpack(second)
    out["second_image_unpack_s"], out["unpacked_mb"] = got.seconds, got.size_bytes / 1e6
    out["cached_lease_s"] = _median_s(lambda: cache.unpack(first), args.repeats)

    root = os.path.join(wd, "box")
    os.makedirs(root)
    out["first_command_host_s"] = _median_s(_box_start(root, cache, None), args.repeats)
    out["first_command_image_s"] = _median_s(_box_start(root, cache, first), args.repeats)
    out["reset_host_s"] = _median_s(_reset(tasks[0], os.path.join(wd, "ep"), cache), args.repeats)
    out["reset_image_s"] = _median_s(
        _reset(in_image[0], os.path.join(wd, "ep"), cache), args.repeats
    )

    for name, insts in [("host", tasks), ("image", in_image)]:
        gold = {inst.instance_id: inst.patch for inst in insts}
        start = time.perf_counter()
        res = swe_eval.evaluate(
            insts,
            gold,
            os.path.join(wd, "eval-" + name),
            workers=args.workers,
            progress=False,
            image_cache=cache,
        )
        wall = time.perf_counter() - start
        out[f"swe_eval_{name}_s"] = wall
        out[f"swe_eval_{name}_resolved"] = sum(r["resolved"] for r in res.values())
        out[f"swe_eval_{name}_inst_per_min"] = 60 * len(insts) / wall
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
