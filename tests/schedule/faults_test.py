"""Fault tolerance of the real training loop (engine process, sandboxed tools, pytest verifiers).

(a) an engine SIGKILLed in the middle of a batch is restarted and its in-flight requests
    retried with the same keys: the run ends at the same parameters and rewards as an
    uninterrupted one;
(b) a verifier that crashes gives reward 0 with its reason (train.log) and is counted in
    metrics.jsonl's verifier_failures;
(c) a NaN gradient skips the step with a clear log line and leaves a checkpoint that a
    resumed run continues from (here with LoRA adapters and an entropy term, so the resumed
    step has a non-zero update even from a random-init policy);
(d) invalid config values fail before any work starts, also from the command line.
"""

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import cpu
from thundersync_jax import algorithms, train
from thundersync_jax.envs.swe import instance as swe_instance
from thundersync_jax.envs.swe import mini_swe
from thundersync_jax.metrics import read_metrics
from thundersync_jax.schedule import engine_fleet
from thundersync_jax.schedule.config_check import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A test_patch that cannot apply: evaluate_patch raises on it (a broken instance).
BROKEN_TEST_PATCH = """\
--- a/no_such_file.py
+++ b/no_such_file.py
@@ -1 +1 @@
-x = 1
+x = 2
"""


def _config(base, schedule="sync", steps=1):
    c = cpu.get_config("smoke")
    c.schedule = schedule
    c.num_steps = steps
    c.seed = 7
    c.sft.cache_dir = str(base / "sft")
    c.rollout.snapshot_root = str(base / "shm")
    c.metrics.timeline_every = 0
    c.metrics.tensorboard = False
    return c


def _final(workdir):
    return load_file(os.path.join(workdir, "final", "model.safetensors"))


def _metrics(workdir):
    return read_metrics(os.path.join(workdir, "metrics.jsonl"))


def _read(path):
    with open(path) as f:
        return f.read()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


def _detach_log_file(workdir):
    root = logging.getLogger("thundersync_jax")
    for handler in list(root.handlers):
        if getattr(handler, "_tsj_workdir", None) == workdir:
            root.removeHandler(handler)
            handler.close()


class _EngineKiller:
    """SIGKILLs engine 0 once requests are in flight; records the pid before and after."""

    def __init__(self):
        self.fleets = []
        self.killed_pid = None
        self.inflight_at_kill = 0
        self.new_pid = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def fleet_class(self):
        killer = self

        class KilledFleet(engine_fleet.EngineFleet):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                killer.fleets.append(self)
                killer._thread.start()

        return KilledFleet

    def _run(self):
        mgr = self.fleets[0].manager
        deadline = time.time() + 600
        # Wait for rollout requests of the batch (after the initial publish).
        while time.time() < deadline and not (mgr.version is not None and mgr._inflight):
            time.sleep(0.01)
        time.sleep(0.3)  # let some decoding happen first
        self.inflight_at_kill = len(mgr._inflight)
        self.killed_pid = mgr.pids[0]
        mgr.kill(0)
        while time.time() < deadline and mgr.pids and mgr.pids[0] == self.killed_pid:
            time.sleep(0.05)
        self.new_pid = mgr.pids[0] if mgr.pids else None


# Folded (issue 23): tests/train_deterministic_test.py SIGKILLs the `group` run's engine in the
# middle of its second batch, and the run still ends at the bits of the uninterrupted `sync`.
@pytest.mark.slow
@pytest.mark.nightly
def test_engine_killed_mid_batch_gives_the_uninterrupted_run(base, monkeypatch, warm_start):
    # Both runs load the warm start as a checkpoint: the session's seed-42 one (conftest
    # `warm_start`, exported once for every smoke-config test), so the runs use seed 42 too.
    init = warm_start("grpo")

    def config():
        c = _config(base)
        c.seed = 42
        c.model.checkpoint = os.path.join(init, "final")
        c.sft.steps = 0
        c.rl.entropy_coef = 0.01  # a non-zero update even if every reward is 0
        return c

    # Both runs use the same workdir path (the first is moved aside), so episode paths in
    # tool output, hence prompts, are identical and only the kill differs.
    killed = str(base / "run")
    train.run(config(), killed)
    clean = str(base / "clean")
    _detach_log_file(killed)  # its train.log moves with the first run
    shutil.move(killed, clean)
    killer = _EngineKiller()
    monkeypatch.setattr(engine_fleet, "EngineFleet", killer.fleet_class())
    train.run(config(), killed)
    assert killer.inflight_at_kill > 0  # the kill hit a batch in progress
    assert killer.new_pid not in (None, killer.killed_pid)  # the manager restarted it
    want, got = _final(clean), _final(killed)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    m_clean, m_killed = _metrics(clean), _metrics(killed)
    assert [m["reward_mean"] for m in m_killed] == [m["reward_mean"] for m in m_clean]
    assert [m["tokens"] for m in m_killed] == [m["tokens"] for m in m_clean]
    assert all(m["rollout_failures"] == 0 for m in m_killed)
    moved = _final(init)
    assert any(not np.array_equal(got[k], moved[k]) for k in moved)  # the step did update


def _broken_task_set(base) -> str:
    """Two mini-SWE instances as a SWE-bench JSONL; the second one's test_patch is broken."""
    tasks = mini_swe.generate(2, 7, str(base / "tasks"), "easy", max_sleep_s=0.0)
    tasks[1] = dataclasses.replace(tasks[1], test_patch=BROKEN_TEST_PATCH)
    path = str(base / "broken.jsonl")
    swe_instance.dump_jsonl(tasks, path)
    return path


def _faulty_config(base, steps):
    c = _config(base, schedule="stream", steps=steps)
    c.env.family = "swe_jsonl"
    c.env.instances = _broken_task_set(base)
    c.env.num_tasks = 2
    c.rl.group_size = 2  # the smallest groups: every step still plays both tasks
    c.sft.steps = 0  # a random-init policy: this test is about faults, not learning
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens_per_turn = 48
    c.lora.enabled = True
    c.lora.rank = 2
    c.lora.publish = "merged"
    c.rl.entropy_coef = 0.05
    c.optim.learning_rate = 1e-2
    return c


@pytest.mark.slow
def test_verifier_crash_and_nan_gradient_then_resume(base, monkeypatch):
    init = str(base / "faulty-init")
    train.run(_faulty_config(base, steps=0), init)  # exports the initial policy only
    work = str(base / "faulty")
    grpo = algorithms.ALGORITHMS["grpo"]

    def nan_learner(setup):
        learner = grpo.make_learner(setup)
        nan = lambda state: jax.tree.map(lambda g: g * jnp.nan, learner.finalize(state))  # noqa: E731
        return learner._replace(finalize=nan)

    monkeypatch.setitem(algorithms.ALGORITHMS, "grpo", grpo._replace(make_learner=nan_learner))
    train.run(_faulty_config(base, steps=1), work)
    monkeypatch.undo()
    log = _read(os.path.join(work, "train.log"))
    # (c) the NaN step is skipped, loudly, and leaves the policy where it was.
    assert "step 0: non-finite gradient" in log and "update skipped" in log
    (m0,) = _metrics(work)
    assert m0["update_skipped"] is True
    want = _final(init)
    for name, value in _final(work).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)
    # (b) the broken instance's verifier crashed: reward 0, reason logged, failure counted.
    assert "verifier failed for g1m" in log and "exception" in log
    assert m0["verifier_failures"] >= 1
    # (c) the checkpoint written after the skipped step resumes into a normal step.
    train.run(_faulty_config(base, steps=2), work)
    log = _read(os.path.join(work, "train.log"))
    assert "resumed from checkpoint at step 1" in log
    m = _metrics(work)
    assert [x["step"] for x in m] == [0, 1]
    assert m[1]["update_skipped"] is False and np.isfinite(m[1]["grad_norm"])
    final = _final(work)
    assert all(np.all(np.isfinite(v)) for v in final.values())
    assert any(not np.array_equal(final[k], want[k]) for k in want)  # step 1 moved the policy


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("rollout.top_p", 1.5, "rollout.top_p=1.5 must be in (0, 1]"),
        ("rl.kl_estimator", "k2", "rl.kl_estimator='k2' is not valid"),
        ("lora.publish", "adapters", "lora.publish='adapters' needs an engine"),
    ],
)
def test_invalid_config_fails_before_any_work(tmp_path, key, value, message):
    c = _config(tmp_path)
    section, name = key.split(".")
    setattr(c[section], name, value)
    c.rl.kl_coef = 0.1  # so the estimator is used
    c.lora.enabled = True  # so the LoRA settings are used
    c.lora.publish = value if key == "lora.publish" else "merged"
    work = tmp_path / "run"
    with pytest.raises((ConfigError, ValueError)) as err:
        train.run(c, str(work))
    assert message in str(err.value)
    assert not work.exists()  # nothing was written, no engine was started


def test_cli_exits_nonzero_with_the_message(tmp_path):
    work = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "experiments.swe_grpo",
        "--config=configs/cpu.py:smoke",
        f"--workdir={work}",
        "--config.rl.group_size=0",
    ]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "rl.group_size=0 must be > 0" in res.stderr
    assert not work.exists()
