"""Run by launch_local in the tests: one replica saving and restoring a sharded TrainState.

argv: workdir, then "save" (save step 3 and exit) or "restore" (restore, print a digest).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from thundersync_jax import distributed
from thundersync_jax.learner import replicas
from thundersync_jax.learner.checkpoint import Checkpointer
from thundersync_jax.learner.train_state import TrainState


def _state(local: Mesh, scale: float) -> TrainState:
    w = NamedSharding(local, PartitionSpec("fsdp", "tp"))
    rep = NamedSharding(local, PartitionSpec())
    params = {"w": jax.device_put(np.arange(24, dtype=np.float32).reshape(6, 4) * scale, w)}
    mu = {"w": jax.device_put(np.full((6, 4), scale, np.float32), w)}
    return TrainState(
        step=jax.device_put(jnp.int32(3), rep),
        params=params,
        opt_state=(mu,),
        rng=jax.device_put(jnp.asarray([1, 2], jnp.uint32), rep),
        data_position=jax.device_put(jnp.int32(5), rep),
    )


def main() -> None:
    workdir, mode = sys.argv[1], sys.argv[2]
    info = distributed.initialize(init_timeout_s=60, heartbeat_timeout_s=10)
    gmesh = distributed.global_mesh(fsdp=2, tp=2)
    local = Mesh(gmesh.devices[info.index], ("fsdp", "tp"))
    ckpt = Checkpointer(workdir, keep=2, global_mesh=gmesh)
    if mode == "save":
        ckpt.save(_state(local, 1.5))
    else:
        like = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            _state(local, 0.0),
        )
        restored = ckpt.restore_latest(like)
        for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(like), strict=True):
            assert got.sharding == want.sharding, (got.sharding, want.sharding)
        np.testing.assert_array_equal(
            np.asarray(restored.params["w"]), np.arange(24, dtype=np.float32).reshape(6, 4) * 1.5
        )
        replicas.check_replicas_identical(restored, step=int(restored.step))
        print(f"RESTORED {info.index} step={int(restored.step)}", flush=True)
    ckpt.close()


if __name__ == "__main__":
    main()
