"""Orbax save/restore of a sharded train state by two real processes (launch_local, gloo):
each leaf is written once (replica 0 of a dp-replicated global array) and every process
restores the same values onto its own shardings."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "learner", "_checkpoint_worker.py")


@pytest.mark.slow
def test_two_processes_save_then_restore(tmp_path, two_processes):
    saved = two_processes(WORKER, str(tmp_path), "save", timeout=240)
    assert saved.returncode == 0, saved.stdout[-3000:] + saved.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]
    restored = two_processes(WORKER, str(tmp_path), "restore", timeout=240)
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
    for p in (0, 1):
        assert f"[p{p}] RESTORED {p} step=3" in restored.stdout
