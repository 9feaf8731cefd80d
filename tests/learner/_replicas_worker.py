"""Run by launch_local in the tests: one replica of a 2-process cross-process sum."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from thundersync_jax import distributed
from thundersync_jax.learner import replicas


def _out_dir() -> str:
    return next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--out="))


def main() -> None:
    info = distributed.initialize(init_timeout_s=60, heartbeat_timeout_s=10)
    mesh = distributed.global_mesh(fsdp=2, tp=2)
    local = Mesh(
        np.array(sorted(jax.local_devices(), key=lambda d: d.id)).reshape(2, 2), ("fsdp", "tp")
    )
    rng = np.random.default_rng(100 + info.index)
    tree = {
        "w": jax.device_put(
            rng.normal(size=(6, 4)).astype(np.float32),
            NamedSharding(local, PartitionSpec("fsdp", "tp")),
        ),
        "b": jax.device_put(
            rng.normal(size=(5,)).astype(np.float32), NamedSharding(local, PartitionSpec())
        ),
    }
    summer = replicas.make_cross_process_sum(mesh)
    total = summer(tree)
    (fn,) = summer.compiled_programs.values()
    lifted = tuple(replicas._lift(x, mesh) for x in jax.tree.leaves(tree))
    hlo = fn.lower(lifted).compile().as_text()
    # Written to a file: gloo's C++ start-up warning shares stdout unflushed and can split
    # a printed line.
    with open(os.path.join(_out_dir(), f"p{info.index}.json"), "w") as f:
        json.dump(
            {
                "all_reduce": hlo.count(" all-reduce("),
                "all_reduce_start": hlo.count("all-reduce-start("),
            },
            f,
        )
    expect = sum(
        np.random.default_rng(100 + p).normal(size=(6, 4)).astype(np.float32)
        for p in range(info.count)
    )
    got = np.asarray(jax.device_get(total["w"]))
    assert total["w"].sharding == tree["w"].sharding, total["w"].sharding
    np.testing.assert_allclose(got, expect, rtol=1e-6)
    replicas.check_replicas_identical(total, step=0)
    print(f"OK {info.index} {info.count} {jnp.sum(total['b'])}", flush=True)
    if "die" in sys.argv[1:] and info.index == 1:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if "die" in sys.argv[1:]:
        import time

        time.sleep(120)  # process 0 would wait for ever; the launcher must stop it


if __name__ == "__main__":
    main()
