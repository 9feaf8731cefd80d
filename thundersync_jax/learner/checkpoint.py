"""Orbax checkpoints of the full train state, written atomically.

Orbax writes each step to a temporary directory and renames it on commit, so a
run killed at any moment leaves only whole checkpoints; `restore_latest` then
takes the newest one that finished.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from thundersync_jax.learner.train_state import TrainState


class Checkpointer:
    """Saves and restores `TrainState` under `workdir/checkpoints`."""

    def __init__(self, workdir: str, keep: int = 2):
        if keep < 1:
            raise ValueError(f"checkpoint.keep={keep} must be >= 1")
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def save(self, state: TrainState) -> None:
        step = int(state.step)
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
        try:
            restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # a corrupt checkpoint must not be silently ignored
            raise RuntimeError(
                f"checkpoint {self.directory}/{step} could not be restored ({e}); "
                "move it aside to resume from an earlier one"
            ) from e
        return TrainState(*restored)

    def close(self) -> None:
        self._manager.close()
