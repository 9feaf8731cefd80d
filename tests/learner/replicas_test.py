"""Two real processes (jax.distributed, gloo) through experiments.launch_local: the one
cross-process sum per step equals the numpy sum, keeps each leaf's sharding, compiles to a
single all-reduce, and a killed replica makes the launcher stop the other (no hang)."""

import json
import os
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "learner", "_replicas_worker.py")


def _launch(two_processes, *worker_args):
    t0 = time.monotonic()
    out = two_processes(WORKER, *worker_args, timeout=180)
    return out, time.monotonic() - t0


@pytest.mark.slow
def test_cross_process_sum_two_processes(tmp_path, two_processes):
    out, _ = _launch(two_processes, f"--out={tmp_path}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for p in (0, 1):
        assert f"[p{p}] OK {p} 2" in out.stdout
        # Both leaves go in one combined all-reduce: one collective per step.
        with open(tmp_path / f"p{p}.json") as f:
            assert json.load(f) == {"all_reduce": 1, "all_reduce_start": 0}


@pytest.mark.slow
def test_a_killed_process_stops_the_run(tmp_path, two_processes):
    out, seconds = _launch(two_processes, "die", f"--out={tmp_path}")
    assert out.returncode == 137, out.stdout[-3000:] + out.stderr[-3000:]
    assert "process 1 killed by signal 9; stopping the others" in out.stderr
    assert seconds < 60  # process 0 sleeps 120 s: the launcher stopped it
