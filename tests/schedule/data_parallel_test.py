"""DataParallel: its start-up refusal, and the batch-end exchange in two real processes
(the loop around it, end to end: tests/train_multiprocess_test.py)."""

import json
import os

import pytest

from configs import cpu
from thundersync_jax import distributed
from thundersync_jax.schedule.config_check import ConfigError
from thundersync_jax.schedule.data_parallel import DataParallel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_deterministic_batch_advantage_needs_one_process():
    """Deterministic `batch` scope keeps its reward buckets open to finalize; the exact
    cross-process sum carries only the folded tally, so several processes are refused."""
    c = cpu.get_config("smoke")
    c.rl.deterministic, c.rl.advantage = True, "batch"
    two = distributed.ProcessInfo(index=0, count=2, coordinator="localhost:1")
    with pytest.raises(ConfigError, match=r"rl.deterministic=True with rl.advantage='batch'.*2"):
        DataParallel.from_config(c, two)
    assert not DataParallel.from_config(c, distributed.ProcessInfo()).several  # one: fine


# Two jax.distributed processes (launch_local, 4 fake devices each): about 20 s.
@pytest.mark.slow
def test_two_processes_finalize_to_the_one_process_gradient(tmp_path, two_processes):
    """`DataParallel.finalize` in two real processes, each folding only its own groups: the
    allgathered counts (and the `batch` advantage's rewards and members), the global totals
    and the cross-process sum give the gradient of ONE state that folded the whole batch, on
    both processes (checked bitwise identical), the params' shardings kept: GRPO's `batch`
    and per-group advantages, the exact sum of `rl.deterministic` (bitwise) and OPD's token
    mean. `merge_metrics` gives the metrics of one whole-batch tally (OPD's reverse KL
    weighted by tokens among them). The end-to-end runs (tests/train_multiprocess_test.py)
    prove the loop around it; this is the batch-end exchange alone, one launch in all."""
    worker = os.path.join(ROOT, "tests", "schedule", "_data_parallel_worker.py")
    out = two_processes(worker, f"--out={tmp_path}", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    per_process = [json.loads((tmp_path / f"p{p}.json").read_text()) for p in (0, 1)]
    assert per_process[0] == per_process[1]  # the same numbers on both replicas
    cases = {r["case"]: r for r in per_process[0]}
    assert sorted(cases) == ["grpo-batch", "grpo-grpo", "grpo-grpo-exact", "metrics", "opd"]
    merged = cases.pop("metrics")  # the step's metrics merged over processes = one tally's
    assert merged["wrong"] == "{}", merged["wrong"]
    assert {"reverse_kl", "reward_mean", "tokens", "mean_policy_lag"} <= set(merged["checked"])
    for name, r in cases.items():
        assert r["shardings_kept"], name
        assert r["scale"] > 0, name
        assert r["max_abs"] <= 1e-5 * r["scale"], (name, r)
    assert cases["grpo-grpo-exact"]["bitwise"]
