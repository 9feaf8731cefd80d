"""End to end, `rl.deterministic=True`: every schedule, interrupted or not, ends at the same bits.

GRPO on `configs/cpu.py:smoke` (the warm start gives mixed groups, so the update is a real
policy-gradient term), two steps, one learner process on 4 fake devices (fsdp=2 x tp=2,
launch_local). `sync` is the session's `deterministic_run` (tests/conftest.py); `group` has its
rollout engine SIGKILLed in the middle of its second batch (the engine manager restarts it,
reloads the weights and resends the in-flight requests with the same keys) and must end at
sync's bytes, with identical per-step rewards and tokens, after updates that really moved the
parameters. `sync` also evaluates after every step and `group` does not, so the same bits prove
that held-out evaluation leaves training unchanged (tests/evaluation_test.py reads sync's eval
metrics). `stream` is proved against the same bits in tests/train_multiprocess_test.py: two
learner processes, one SIGKILLed inside step 2 and the run resumed from the step-1 checkpoint
(one killed run proves the resume for every schedule and process count). One score-gradient
call per trajectory and exactly associative tallies (DESIGN §8) make arrival order irrelevant
to the bits; a resumed batch starts from a whole checkpoint (the train state only: a batch's
tallies are never saved half-folded) and resamples the same trajectories (keyed sampling), and
a resent request samples the same tokens, so neither kill leaves a trace.

The runs are processes with the suite's inherited XLA flags (one compiled program for all:
the same bits) and share the session's persistent XLA cache, so only the first compiles.
"""

import hashlib
import os
import re
import signal
import subprocess
import time

import pytest

from thundersync_jax.metrics import read_metrics
from thundersync_jax.rollout.client import EngineClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2


def _digest(workdir):
    with open(os.path.join(workdir, "final", "model.safetensors"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _metrics(workdir):
    return read_metrics(os.path.join(workdir, "metrics.jsonl"))


def _per_step(workdir, key):
    return [m[key] for m in _metrics(workdir)]


def _engine_killed_in_step_two(cmd, workdir, log_path):
    """Runs `cmd` (launch_local, one process) to the end, SIGKILLing its rollout engine while
    it decodes the second batch's requests; returns the engine manager's restart line."""
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:  # a file, not a pipe nobody drains during the run
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        first = os.path.join(workdir, "checkpoints", "1")
        deadline = time.time() + 1500
        while not os.path.isdir(first) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended before the engine kill (rc {proc.returncode})"
        engine, address = _engine(launcher=proc.pid)
        _wait_until_decoding(address, version=1)
        os.kill(engine, signal.SIGKILL)
        proc.wait(timeout=1500)
    with open(log_path) as f:
        out = f.read()
    assert proc.returncode == 0, out[-3000:]
    # (the progress bar shares the stream: the line may follow a carriage return)
    (line,) = re.findall(r"engine manager: engine 0 [^\r\n]*", out)
    return line


def _wait_until_decoding(address: str, version: int, requests: int = 2) -> None:
    """Returns once the engine serves `version` (the second batch's weights) with at least
    `requests` requests admitted or queued, asked over its own health call (a CPU-busy probe
    mistook a slow weight load on a loaded machine for decoding)."""
    deadline = time.time() + 600
    with EngineClient(address) as client:
        while time.time() < deadline:
            status = client.health(timeout_s=60)
            if status["version"] >= version and status["active"] + status["queued"] >= requests:
                return
            time.sleep(0.05)
    raise AssertionError(f"the engine never decoded version {version}: {status}")


def _engine(launcher: int) -> tuple[int, str]:
    """(pid, address) of the rollout engine started by the learner that `launcher`
    (launch_local) started: the engine's `--parent-pid` is a child of the launcher."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if b"thundersync_jax.rollout.server" not in args:
                continue
            with open(f"/proc/{int(args[args.index(b'--parent-pid') + 1])}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == launcher:
                    return int(pid), args[args.index(b"--address") + 1].decode()
        except OSError:
            continue
    raise AssertionError(f"launch_local {launcher} started no rollout engine")


def test_every_schedule_and_a_killed_engine_end_at_the_same_bits(
    tmp_path, deterministic_run, deterministic_command
):
    sync = deterministic_run()
    group = str(tmp_path / "group")
    cmd = deterministic_command("group", group)
    restart = _engine_killed_in_step_two(cmd, group, tmp_path / "group.log")
    # The manager restarted the killed engine with requests of the batch in flight.
    assert "exited with -9; restarting" in restart, restart
    assert int(restart.rsplit("(", 1)[1].split()[0]) > 0, restart
    # Real updates: mixed rewards in a group, a non-zero gradient, applied, every step.
    assert all(n >= 1 for n in _per_step(sync, "mixed_groups"))
    assert all(g > 0 for g in _per_step(sync, "grad_norm"))
    assert not any(_per_step(sync, "update_skipped"))
    assert _per_step(group, "step") == list(range(STEPS))
    for key in ("reward_mean", "tokens"):
        assert _per_step(group, key) == _per_step(sync, key), key
    # sync evaluated after every step and group did not (conftest EVAL_FLAGS): the same bits
    # also prove that evaluation leaves training unchanged (tests/evaluation_test.py).
    evaluated = [["eval_pass@1" in m for m in _metrics(w)] for w in (sync, group)]
    assert evaluated == [[True] * STEPS, [False] * STEPS], evaluated
    assert _digest(group) == _digest(sync)
