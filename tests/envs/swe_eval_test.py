"""swe_eval CLI end to end: gold, empty and non-applying patches, a broken instance and an
unknown prediction id are all recorded in R.json; nothing crashes."""

import dataclasses
import json
import subprocess
import sys

import pytest

from thundersync_jax.envs.swe import instance as instance_lib
from thundersync_jax.envs.swe import mini_swe


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe_eval")
    tasks = mini_swe.generate(
        3, seed=11, cache_dir=str(root / "cache"), difficulty="easy", max_sleep_s=0
    )
    broken = dataclasses.replace(tasks[0], instance_id="broken", repo_path=str(root / "no-repo"))
    instance_lib.dump_jsonl([*tasks, broken], str(root / "instances.jsonl"))
    garbage = "diff --git a/p/x.py b/p/x.py\n--- a/p/x.py\n+++ b/p/x.py\n@@ -1 +1 @@\n-nope\n+yes\n"
    predictions = [
        {"instance_id": tasks[0].instance_id, "model_patch": tasks[0].patch},
        {"instance_id": tasks[1].instance_id, "model_patch": ""},
        {"instance_id": tasks[2].instance_id, "model_patch": garbage},
        {"instance_id": "broken", "model_patch": tasks[0].patch},
        {"instance_id": "not-an-instance", "model_patch": ""},
    ]
    (root / "preds.jsonl").write_text("".join(json.dumps(p) + "\n" for p in predictions))
    return root, tasks


def _run(root, predictions, out):
    cmd = [
        sys.executable,
        "-m",
        "thundersync_jax.envs.swe_eval",
        "--instances",
        str(root / "instances.jsonl"),
        "--predictions",
        predictions,
        "--out",
        str(out),
        "--workers",
        "3",
        "--timeout",
        "60",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stderr


def test_cli_records_every_outcome(files):
    root, tasks = files
    results, stderr = _run(root, str(root / "preds.jsonl"), root / "R.json")
    assert "swe_eval" in stderr and "resolved 1/5" in stderr  # progress bar and summary
    gold, empty, bad = (results[t.instance_id] for t in tasks)
    assert gold["resolved"] and gold["reward"] == 1.0
    assert set(gold["tests"]) == set(tasks[0].test_ids)
    assert set(gold["tests"].values()) == {"PASSED"}
    assert not empty["resolved"] and empty["reward"] == 0.0 and empty["patch_applied"]
    assert {empty["tests"][t] for t in tasks[1].fail_to_pass} == {"FAILED"}
    assert not bad["resolved"] and not bad["patch_applied"] and bad["tests"] == {}
    assert bad["reason"].startswith("model patch does not apply") and "p/x.py" in bad["reason"]
    broken = results["broken"]
    assert broken["reward"] == 0.0 and not broken["resolved"] and "no-repo" in broken["error"]
    assert results["not-an-instance"]["error"] == "unknown instance_id"


def test_cli_gold_mode(files):
    root, tasks = files
    results, _ = _run(root, "gold", root / "R_gold.json")
    assert all(results[t.instance_id]["resolved"] for t in tasks)
    assert not results["broken"]["resolved"]
