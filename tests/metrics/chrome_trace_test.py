"""Chrome / Perfetto trace export."""

import json

import pytest

from thundersync_jax import metrics
from thundersync_jax.metrics import Timeline


def test_trace_is_valid_json_with_complete_events(tmp_path):
    tl = Timeline(start_s=50.0, schedule="group")
    tl.record("rollout", 50.0, 52.0, traj_id=7, group=1, member=2, tokens=11, reward=1.0)
    tl.record("chunk", 52.0, 52.5, reason="group", group=1, ids=(7,))
    tl.record("opt", 52.5, 52.75)
    tl.record("publish", 52.75, 53.0)
    tl.record("verify", 51.0, 52.0, traj_id=7)
    path = tmp_path / "trace.json"
    metrics.write_chrome_trace(tl, path)
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"] == {"schedule": "group"}
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 5
    for e in complete:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["dur"] >= 0
    by_name = {e["name"]: e for e in complete}
    assert by_name["g1m2"]["ts"] == pytest.approx(0.0)
    assert by_name["g1m2"]["dur"] == pytest.approx(2e6)
    assert by_name["g1m2"]["args"] == {
        "traj_id": 7,
        "group": 1,
        "member": 2,
        "tokens": 11,
        "reward": 1.0,
    }
    chunk = by_name["group g1 x1"]
    assert (chunk["ts"], chunk["dur"]) == pytest.approx((2e6, 0.5e6))
    assert chunk["args"] == {"reason": "group", "group": 1, "ids": [7]}
    # Learner events share one row; rollouts and other kinds live in their own processes.
    learner = {(by_name[n]["pid"], by_name[n]["tid"]) for n in ("opt", "publish", "group g1 x1")}
    assert len(learner) == 1
    assert len({by_name[n]["pid"] for n in ("g1m2", "opt", "verify")}) == 3
    names = {
        e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and "name" in e["args"]
    }
    assert {"rollouts", "learner", "g1m2", "verify"} <= names
