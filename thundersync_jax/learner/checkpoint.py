"""Orbax checkpoints of the full train state, written atomically.

Orbax writes each step to a temporary directory and renames it on commit, so a
run killed at any moment leaves only whole checkpoints; `restore_latest` then
takes the newest one that finished.

Several learner processes (DESIGN §7) hold identical replicas on their own devices. Every
process takes part in each save and restore (Orbax's barriers), with each leaf lifted to a
global array replicated over `dp` (`replicas.to_global`, no copy): Orbax writes only replica
0 of a global array, so process 0's devices write each byte once into the shared directory,
and a restore hands every process the same values back on its own shardings. One code
path, no "process 0 saves while the others wait" special case, and Orbax's own commit
protocol still makes a checkpoint whole or absent when any process dies mid-save.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from thundersync_jax.learner import replicas
from thundersync_jax.learner.train_state import TrainState


class Checkpointer:
    """Saves and restores `TrainState` under `workdir/checkpoints`."""

    def __init__(self, workdir: str, keep: int = 2, global_mesh=None):
        """`global_mesh`: the (dp, fsdp, tp) mesh of a multi-process run, else None."""
        if keep < 1:
            raise ValueError(f"checkpoint.keep={keep} must be >= 1")
        self._global_mesh = global_mesh if jax.process_count() > 1 else None
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def save(self, state: TrainState) -> None:
        step = int(state.step)
        if self._global_mesh is not None:
            state = jax.tree.map(lambda x: replicas.to_global(x, self._global_mesh), state)
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore_latest(self, like: TrainState) -> TrainState | None:
        """The newest finished checkpoint, shaped like `like`; None when there is none."""
        step = self._manager.latest_step()
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        if self._global_mesh is not None:
            abstract = jax.tree.map(
                lambda a, x: jax.ShapeDtypeStruct(
                    a.shape, a.dtype, sharding=replicas.global_sharding(x, self._global_mesh)
                ),
                abstract,
                like,
            )
        try:
            restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # a corrupt checkpoint must not be silently ignored
            raise RuntimeError(
                f"checkpoint {self.directory}/{step} could not be restored ({e}); "
                "move it aside to resume from an earlier one"
            ) from e
        restored = TrainState(*restored)
        if self._global_mesh is not None:
            leaves = [
                replicas.to_local(g, x)
                for g, x in zip(jax.tree.leaves(restored), jax.tree.leaves(like), strict=True)
            ]
            restored = jax.tree.unflatten(jax.tree.structure(like), leaves)
        return restored

    def close(self) -> None:
        self._manager.close()
