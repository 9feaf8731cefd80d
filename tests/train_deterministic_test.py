"""End to end, `rl.deterministic=True`: the streamed update is bitwise the synchronous one.

GRPO on `configs/cpu.py:smoke` with no entropy or KL term (the warm start gives mixed
groups, so the update is the pure policy-gradient term): `sync` and `stream` runs of the
same seed end at byte-identical `final/model.safetensors`, with identical per-step rewards,
after an update that really moved the parameters. One score-gradient call per trajectory
and exactly associative tallies (DESIGN §8) make arrival order irrelevant to the bits.
`TSJ_TEST_SFT_CACHE` shares the warm start with the other seed-42 smoke tests.
"""

import hashlib
import os

import pytest

from configs import cpu
from thundersync_jax import train
from thundersync_jax.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def _run(schedule, base):
    c = cpu.get_config("smoke")
    c.schedule, c.num_steps, c.seed = schedule, 1, 42
    c.rl.deterministic = True
    c.rl.entropy_coef = c.rl.kl_coef = 0.0
    c.sft.cache_dir = os.environ.get("TSJ_TEST_SFT_CACHE") or str(base / "sft")
    c.rollout.snapshot_root = str(base / "shm")
    c.metrics.timeline_every, c.metrics.tensorboard = 0, False
    wd = base / schedule
    train.run(c, str(wd))
    with open(wd / "final" / "model.safetensors", "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return digest, read_metrics(str(wd / "metrics.jsonl"))


def test_sync_and_stream_end_at_the_same_bits(tmp_path):
    sync_digest, sync_metrics = _run("sync", tmp_path)
    stream_digest, stream_metrics = _run("stream", tmp_path)
    (m,) = sync_metrics
    # A real update: mixed rewards in a group, a non-zero gradient, applied.
    assert m["mixed_groups"] >= 1 and m["grad_norm"] > 0 and not m["update_skipped"]
    assert [x["reward_mean"] for x in stream_metrics] == [m["reward_mean"]]
    assert [x["tokens"] for x in stream_metrics] == [m["tokens"]]
    assert stream_digest == sync_digest
