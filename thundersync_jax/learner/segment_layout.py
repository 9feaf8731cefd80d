"""Where the segment passes' arrays live on the learner mesh (`segments.py`, DESIGN §2).

    layout = segment_layout(cfg, mesh, grad_shardings)   # mesh None: one device, no placement

* Caches k/v and their cotangent buffers dk/dv ([L, 1, S, K, H]): the KV-head axis K split over
  "tp" when K divides by the tp size (each tp shard then holds the heads its attention shard
  computes, as the k/v projections' "kv_heads" axis is split), else whole on every device.
  Replicated over "fsdp": one trajectory is one row, and the batch axis is what "fsdp" splits
  in the chunks (`mesh.batch_sharding`); splitting the slots S instead would make every
  segment's cache write and attention read cross devices.
* Segment inputs (tokens, masks, weights, the start slot) and per-token / scalar outputs:
  replicated (a segment is one short row: every device reads all of it).
* Gradients: the trainable params' shardings, so the accumulator adds them into tallies laid
  out the same way without a reshard.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from thundersync_jax.learner import mesh as mesh_lib


class SegmentLayout(NamedTuple):
    """The shardings of the segment passes (all None: one device, today's placement).

    Attributes:
      cache: NamedSharding of k, v, dk, dv.
      replicated: NamedSharding of segment inputs and per-token / scalar outputs.
      grads: NamedSharding pytree of the trainable params (the gradients' layout).
    """

    cache: NamedSharding | None = None
    replicated: NamedSharding | None = None
    grads: Any = None

    def place(self, tree: Any, sharding: NamedSharding | None) -> Any:
        """`tree` put on `sharding` (one transfer for the whole tree); as is without a mesh."""
        return tree if sharding is None else jax.device_put(tree, sharding)

    def jit_kwargs(self, out_shardings: Any) -> dict:
        """`jax.jit` keyword arguments fixing the outputs' shardings (none without a mesh)."""
        return {} if self.cache is None else {"out_shardings": out_shardings}


def cache_spec(num_kv_heads: int, mesh: Mesh) -> PartitionSpec:
    """[L, 1, S, K, H] cache spec: K over "tp" when it divides (see the module docstring)."""
    tp = int(mesh.shape["tp"])
    heads = "tp" if tp > 1 and num_kv_heads % tp == 0 else None
    return PartitionSpec(None, None, None, heads, None)


def segment_layout(cfg: Any, mesh: Mesh | None, grad_shardings: Any = None) -> SegmentLayout:
    """The layout for a Qwen3 config on `mesh` ("fsdp", "tp"); ValueError on a bad pairing."""
    if mesh is None:
        if grad_shardings is not None:
            raise ValueError("grad_shardings need the mesh they are on (pass mesh=)")
        return SegmentLayout()
    missing = [a for a in ("fsdp", "tp") if a not in mesh.axis_names]
    if missing:
        raise ValueError(
            f"segment passes need the learner mesh with axes ('fsdp', 'tp'), got axes "
            f"{mesh.axis_names} (missing {missing}): use `learner.mesh.learner_mesh`"
        )
    if grad_shardings is None:
        raise ValueError(
            "a sharded segment learner needs grad_shardings: the trainable params' "
            "NamedShardings (`sharding.param_shardings`, or `sharding.replicated` for LoRA "
            "adapters), so its gradients land where the accumulator's tallies are"
        )
    cache = NamedSharding(mesh, cache_spec(int(cfg.num_key_value_heads), mesh))
    return SegmentLayout(cache, mesh_lib.replicated(mesh), grad_shardings)
