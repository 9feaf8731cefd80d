"""Orbax save/restore of a sharded train state by two real processes (launch_local, gloo):
each leaf is written once (replica 0 of a dp-replicated global array) and every process
restores the same values onto its own shardings."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "learner", "_checkpoint_worker.py")


def _launch(*args):
    launcher = [sys.executable, "-m", "experiments.launch_local", "--num_processes=2"]
    cmd = [*launcher, "--devices_per_process=4", "--grace_s=3", "--", sys.executable, WORKER, *args]
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)


@pytest.mark.slow
def test_two_processes_save_then_restore(tmp_path):
    saved = _launch(str(tmp_path), "save")
    assert saved.returncode == 0, saved.stdout[-3000:] + saved.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]
    restored = _launch(str(tmp_path), "restore")
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
    for p in (0, 1):
        assert f"[p{p}] RESTORED {p} step=3" in restored.stdout
