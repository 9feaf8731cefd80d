"""DataParallel's start-up refusal (multi-process runs: tests/train_multiprocess_test.py)."""

import pytest

from configs import cpu
from thundersync_jax import distributed
from thundersync_jax.schedule.config_check import ConfigError
from thundersync_jax.schedule.data_parallel import DataParallel


def test_deterministic_batch_advantage_needs_one_process():
    """Deterministic `batch` scope keeps its reward buckets open to finalize; the exact
    cross-process sum carries only the folded tally, so several processes are refused."""
    c = cpu.get_config("smoke")
    c.rl.deterministic, c.rl.advantage = True, "batch"
    two = distributed.ProcessInfo(index=0, count=2, coordinator="localhost:1")
    with pytest.raises(ConfigError, match=r"rl.deterministic=True with rl.advantage='batch'.*2"):
        DataParallel.from_config(c, two)
    assert not DataParallel.from_config(c, distributed.ProcessInfo()).several  # one: fine
