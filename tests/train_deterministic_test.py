"""End to end, `rl.deterministic=True`: every schedule, interrupted or not, ends at the same bits.

GRPO on `configs/cpu.py:smoke` with no entropy or KL term (the warm start gives mixed
groups, so the update is the pure policy-gradient term), two steps. `sync` runs through;
`group` has its rollout engine SIGKILLed in the middle of its second batch (the engine
manager restarts it, reloads the weights and resends the in-flight requests with the same
keys); `stream` is killed with SIGKILL inside its second step and rerun, resuming from the
step-1 checkpoint (the kill is schedule-independent: one killed schedule proves the resume).
All three end at byte-identical `final/model.safetensors`, with identical per-step rewards
and tokens, after updates that really moved the parameters. One score-gradient call per
trajectory and exactly associative tallies (DESIGN §8) make arrival order irrelevant to the
bits; a resumed batch starts from a whole checkpoint (the train state only: a batch's tallies
are never saved half-folded) and resamples the same trajectories (keyed sampling), and a
resent request samples the same tokens, so neither kill leaves a trace.

The runs are processes with the suite's inherited XLA flags (one compiled program for all
three: the same bits) and share the session's persistent XLA cache, so only the first
compiles. `TSJ_TEST_SFT_CACHE` shares the warm start with the other seed-42 smoke tests.
"""

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from thundersync_jax.metrics import read_metrics
from thundersync_jax.rollout.client import EngineClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2


def _command(schedule, workdir, base):
    sft = os.environ.get("TSJ_TEST_SFT_CACHE") or str(base / "sft")
    return [sys.executable, "-m", "experiments.swe_grpo", "--config=configs/cpu.py:smoke",
            f"--workdir={workdir}", f"--config.schedule={schedule}", f"--config.num_steps={STEPS}",
            "--config.seed=42", "--config.rl.deterministic=True", "--config.rl.entropy_coef=0.0",
            "--config.rl.kl_coef=0.0", f"--config.sft.cache_dir={sft}",
            f"--config.rollout.snapshot_root={base / 'shm'}", "--config.checkpoint.every=1",
            "--config.metrics.timeline_every=0", "--config.metrics.tensorboard=False"]  # fmt: skip


def _env(base):
    # The session's compilation cache (tests/conftest.py) is inherited: identical programs in
    # every run, so only the first compiles.
    return dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")


def _run(cmd, base):
    out = subprocess.run(
        cmd, cwd=REPO, env=_env(base), capture_output=True, text=True, timeout=3000
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def _started_past_step_one(cmd, workdir, base, **popen):
    """`cmd` started, once its step-1 checkpoint exists (or it ended)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(base), stdout=subprocess.DEVNULL, **popen)
    first = os.path.join(workdir, "checkpoints", "1")
    deadline = time.time() + 3000
    while not os.path.isdir(first) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    return proc


def _killed_in_step_two_then_resumed(cmd, workdir, base):
    proc = _started_past_step_one(cmd, workdir, base, stderr=subprocess.DEVNULL,
                                  start_new_session=True)  # fmt: skip
    time.sleep(1.0)  # inside the second step
    assert proc.poll() is None, f"{cmd[5]}: the run ended before the kill (rc {proc.returncode})"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(os.path.join(workdir, "final")), "killed after the last step"
    _run(cmd, base)


def _digest(workdir):
    with open(os.path.join(workdir, "final", "model.safetensors"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _per_step(workdir, key):
    return [m[key] for m in read_metrics(os.path.join(workdir, "metrics.jsonl"))]


def _engine_killed_in_step_two(cmd, workdir, base):
    """Runs `cmd` to the end, SIGKILLing its rollout engine while it decodes the second batch's
    requests; returns the engine manager's restart line."""
    proc = _started_past_step_one(cmd, workdir, base, stderr=subprocess.PIPE, text=True)
    assert proc.poll() is None, f"the run ended before the engine kill (rc {proc.returncode})"
    engine, address = _engine(proc.pid)
    _wait_until_decoding(address, version=1)
    os.kill(engine, signal.SIGKILL)
    _, err = proc.communicate(timeout=3000)
    assert proc.returncode == 0, err[-3000:]
    # (the progress bar shares stderr: the line may follow a carriage return)
    (line,) = re.findall(r"engine manager: engine 0 [^\r\n]*", err)
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


def _engine(run_pid: int) -> tuple[int, str]:
    """(pid, address) of the rollout engine that the run `run_pid` started."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"thundersync_jax.rollout.server" in args and str(run_pid).encode() in args:
            return int(pid), args[args.index(b"--address") + 1].decode()
    raise AssertionError(f"run {run_pid} has no rollout engine process")


def test_every_schedule_and_a_killed_resume_end_at_the_same_bits(tmp_path, warm_start):
    warm_start("grpo")  # trained once per session (under a lock); the runs find it cached
    wd = {s: str(tmp_path / s) for s in ("sync", "group", "stream")}
    _run(_command("sync", wd["sync"], tmp_path), tmp_path)
    restart = _engine_killed_in_step_two(_command("group", wd["group"], tmp_path), wd["group"],
                                         tmp_path)  # fmt: skip
    # The manager restarted the killed engine with requests of the batch in flight.
    assert "exited with -9; restarting" in restart, restart
    assert int(restart.rsplit("(", 1)[1].split()[0]) > 0, restart
    _killed_in_step_two_then_resumed(_command("stream", wd["stream"], tmp_path), wd["stream"],
                                     tmp_path)  # fmt: skip
    # Real updates: mixed rewards in a group, a non-zero gradient, applied, every step.
    assert all(n >= 1 for n in _per_step(wd["sync"], "mixed_groups"))
    assert all(g > 0 for g in _per_step(wd["sync"], "grad_norm"))
    assert not any(_per_step(wd["sync"], "update_skipped"))
    for schedule in ("group", "stream"):
        assert _per_step(wd[schedule], "step") == list(range(STEPS)), schedule
        for key in ("reward_mean", "tokens"):
            assert _per_step(wd[schedule], key) == _per_step(wd["sync"], key), (schedule, key)
        assert _digest(wd[schedule]) == _digest(wd["sync"]), schedule
