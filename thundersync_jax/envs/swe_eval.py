"""Score given patches on SWE-bench-format instances, without any model (harness style).

    python -m thundersync_jax.envs.swe_eval --instances I.jsonl --predictions P.jsonl \
        --out R.json --workers 4 [--images DIR] [--format auto|swe-bench|swe-smith|...]

`--instances` is any dataset `envs.swe.dataset` reads: SWE-bench / Verified / SWE-Gym /
SWE-smith rows in .jsonl, .json, .parquet, a save_to_disk directory or hf:ORG/NAME[:SPLIT]
(offline). With `--images DIR` (an image store, `envs.images.store`) each row's image is
found by name: SWE-smith's `image_name`, or the SWE-bench harness's instance image name.

Each prediction is {"instance_id", "model_patch"} (JSONL or a JSON list;
`--predictions gold` scores every instance's own gold patch). R.json maps each
instance id to {"resolved", "reward", "tests": {id: PASSED|FAILED|ERROR},
"reason", "error", "patch_applied"}. A patch that does not apply, a crashing
or timed-out verifier, or a prediction for an unknown instance is recorded
there with its reason; it never stops the run.

Instances with an `image` are scored inside it; images are unpacked once into
`--image-cache` (default $TSJ_IMAGE_CACHE or ~/.cache/thundersync_jax/images).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import tqdm

from thundersync_jax.envs import verify
from thundersync_jax.envs.images import cache as image_cache_lib
from thundersync_jax.envs.swe import dataset, verifier
from thundersync_jax.envs.swe import instance as instance_lib
from thundersync_jax.envs.swe.instance import SweInstance


def evaluate(
    instances: Sequence[SweInstance],
    predictions: Mapping[str, str],
    workdir: str,
    *,
    workers: int = 1,
    sandbox_config: Mapping[str, Any] | None = None,
    partial_credit: bool = False,
    timeout_s: float | None = None,
    progress: bool = True,
    image_cache: image_cache_lib.ImageCache | None = None,
) -> dict[str, dict[str, Any]]:
    """Scores predictions[id] on each instance that has one; returns the R.json mapping.

    Args:
      instances: the tasks.
      predictions: instance id -> model patch; ids without an instance are recorded as errors.
      workdir: scratch space (checkouts, mirrors of remote repositories).
      workers: instances evaluated concurrently.
      sandbox_config: keyword arguments of `Sandbox` for the test runs.
      partial_credit: reward the fraction of passing tests instead of all-or-nothing.
      timeout_s: wall-clock limit of one test run.
      progress: show a progress bar on stderr.
      image_cache: where instance images are unpacked (default images' default cache).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    by_id = {inst.instance_id: inst for inst in instances}
    results: dict[str, dict[str, Any]] = {}
    for unknown in sorted(set(predictions) - set(by_id)):
        results[unknown] = _entry(0.0, False, {}, "no such instance", "unknown instance_id", False)
    todo = [by_id[i] for i in predictions if i in by_id]

    def one(inst: SweInstance) -> dict[str, Any]:
        res = verify.run_verifier(
            lambda: verifier.evaluate_patch(
                inst,
                predictions[inst.instance_id],
                workdir,
                sandbox_config,
                partial_credit=partial_credit,
                timeout_s=timeout_s,
                image_cache=image_cache,
            ),
            name=inst.instance_id,
        )
        d = res.details
        return _entry(
            res.reward,
            bool(d.get("resolved", False)) and res.error is None,
            dict(d.get("tests", {})),
            res.reason,
            res.error,
            bool(d.get("patch_applied", False)),
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(one, inst): inst.instance_id for inst in todo}
        bar = tqdm.tqdm(total=len(futures), desc="swe_eval", unit="inst", disable=not progress)
        resolved = 0
        for fut in concurrent.futures.as_completed(futures):
            results[futures[fut]] = entry = fut.result()
            resolved += entry["resolved"]
            bar.update(1)
            bar.set_postfix(resolved=resolved)
        bar.close()
    return {k: results[k] for k in sorted(results)}


def _entry(reward, resolved, tests, reason, error, applied) -> dict[str, Any]:
    return {
        "resolved": resolved,
        "reward": float(reward),
        "tests": tests,
        "reason": reason,
        "error": error,
        "patch_applied": applied,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--instances", required=True, help="a dataset (see above)")
    p.add_argument("--images", default="", help="image store: rows' images by name")
    p.add_argument("--format", default="auto", choices=dataset.FORMATS, help="row format")
    p.add_argument(
        "--predictions", required=True, help='JSONL of {instance_id, model_patch}, or "gold"'
    )
    p.add_argument("--out", required=True, help="where to write R.json")
    p.add_argument("--workers", type=int, default=4, help="instances evaluated concurrently")
    p.add_argument("--workdir", default="", help="scratch directory (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per test run")
    p.add_argument("--memory-mb", type=int, default=2048, help="sandbox address-space limit")
    p.add_argument("--partial-credit", action="store_true", help="reward = fraction passing")
    p.add_argument("--image-cache", default="", help="rootfs cache for instance images")
    p.add_argument("--image-cache-gb", type=float, default=None, help="image cache size limit")
    p.add_argument(
        "--image-setuid",
        choices=("refuse", "strip"),
        default=None,
        help="layers with setuid/setgid files: refuse them, or unpack with the bits cleared",
    )
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    try:
        instances = dataset.load(args.instances, images=args.images, fmt=args.format)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.predictions == "gold":
        predictions = {inst.instance_id: inst.patch for inst in instances}
    else:
        predictions = instance_lib.load_predictions(args.predictions)
    sandbox_config = {"timeout_s": args.timeout, "memory_mb": args.memory_mb}
    default = image_cache_lib.default_cache()  # $TSJ_IMAGE_CACHE* unless flags say else
    image_cache = image_cache_lib.ImageCache(
        args.image_cache or default.root,
        max_bytes=default.max_bytes
        if args.image_cache_gb is None
        else int(args.image_cache_gb * (1 << 30)),
        setuid=args.image_setuid or default.setuid,
    )
    with tempfile.TemporaryDirectory(prefix="swe_eval-") as tmp:
        results = evaluate(
            instances,
            predictions,
            os.path.abspath(args.workdir or tmp),
            workers=args.workers,
            sandbox_config=sandbox_config,
            partial_credit=args.partial_credit,
            progress=not args.no_progress,
            image_cache=image_cache,
        )
    out_tmp = args.out + ".tmp"
    with open(out_tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(out_tmp, args.out)
    resolved = sum(r["resolved"] for r in results.values())
    print(f"resolved {resolved}/{len(results)}; results in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
