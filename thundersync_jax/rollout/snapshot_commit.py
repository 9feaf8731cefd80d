"""Orbax's atomic-rename commit for snapshots, with its file operations done inline.

`ocp.Checkpointer` commits a save through a TemporaryPath class (an Orbax extension point): the
stock AtomicRenameTemporaryPath creates `<final>.orbax-checkpoint-tmp` with an initial
`_CHECKPOINT_METADATA`, and at commit records the commit time, writes `commit_success.txt` and
renames the directory to `<final>`. It runs each of those file calls through
`asyncio.to_thread` on a new event loop, which starts new threads on every save; on the loaded
2-core dev machine that cost ~90 ms per save (and ~15 ms per restore check), more than copying
100 MB. This subclass does the same steps in the same order, in the calling thread.
"""

from __future__ import annotations

import os
import shutil
import time

from etils import epath
from orbax.checkpoint._src.metadata import checkpoint as checkpoint_metadata
from orbax.checkpoint._src.metadata import step_metadata_serialization
from orbax.checkpoint.path import atomicity, atomicity_types

COMMIT_SUCCESS_FILE = atomicity_types.COMMIT_SUCCESS_FILE
TMP_DIR_SUFFIX = atomicity_types.TMP_DIR_SUFFIX


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class InlineRenameTemporaryPath(atomicity.AtomicRenameTemporaryPath):
    """AtomicRenameTemporaryPath without a thread per file operation; also fsyncs the rename."""

    @classmethod
    async def validate(cls, temporary_path: epath.Path) -> None:
        path = os.fspath(temporary_path)
        if os.path.islink(path) or TMP_DIR_SUFFIX not in temporary_path.name:
            raise atomicity_types.ValidationError(f"{path} is not an Orbax temporary directory")
        if not os.path.isdir(path):
            raise atomicity_types.ValidationError(f"expected a directory at {path}")

    @classmethod
    async def validate_final(cls, final_path: epath.Path) -> None:
        path = os.fspath(final_path)
        if TMP_DIR_SUFFIX in final_path.name:
            raise atomicity_types.ValidationError(f"{path} is an uncommitted temporary directory")
        if not os.path.isdir(path):
            raise atomicity_types.ValidationError(f"expected a directory at {path}")

    async def create(self) -> epath.Path:
        tmp = os.fspath(self.get())
        if os.path.exists(tmp):  # left by a save that died before its commit
            shutil.rmtree(tmp)
        os.makedirs(tmp, mode=self._path_permission_mode or 0o777)
        if self._checkpoint_metadata_store is not None:
            self._checkpoint_metadata_store.write(
                file_path=checkpoint_metadata.step_metadata_file_path(self.get()),
                metadata=step_metadata_serialization.serialize(
                    checkpoint_metadata.StepMetadata(init_timestamp_nsecs=time.time_ns())
                ),
            )
        return self.get()

    async def finalize(self) -> None:
        tmp, final = os.fspath(self.get()), os.fspath(self.get_final())
        store = self._checkpoint_metadata_store
        if store is not None:
            store.wait_until_finished()
            store.update(
                file_path=checkpoint_metadata.step_metadata_file_path(self.get()),
                commit_timestamp_nsecs=time.time_ns(),
            )
            store.wait_until_finished()
        with open(os.path.join(tmp, COMMIT_SUCCESS_FILE), "w") as f:
            f.write(f"Checkpoint commit was successful to {final}")
        _fsync_dir(tmp)
        os.rename(tmp, final)  # fails if `final` exists: a version is never overwritten
        _fsync_dir(os.path.dirname(final))
