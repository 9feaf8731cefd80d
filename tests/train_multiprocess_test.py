"""End to end: two data-parallel learner processes (launch_local, 2 x 4 fake CPU devices,
fsdp=2 x tp=2 each) against the one-process, one-device run of the same config.

GRPO (`configs/cpu.py:smoke`, stream) and, under --nightly, OPD
(`configs/terminal_opd_cpu.py:smoke`; in `make test` its batch-end exchange and metrics
merge are tests/schedule/data_parallel_test.py's, in two real processes): the same final
parameters within 1e-4 of the update and identical per-step rewards (keyed sampling: a
trajectory does not depend on which process samples it); replicas checked bitwise identical
every step (debug mode); process 0's metrics carry every process's learner figures. GRPO's
2-process run (OPD's too, under --nightly) is SIGKILLed (process 1, inside step 2) and
relaunched: the kill ends the run (no hang) and the relaunch resumes from the step-1
checkpoint, so the comparison with the uninterrupted one-process run proves the resume too
(one launch instead of an uninterrupted 2-process run beside a killed one). GRPO's is also
`rl.deterministic=True`: besides matching the (float) one-process run, it is bitwise the
`sync` run of one process on the same 4-device mesh (conftest `deterministic_run`), kill and
resume included (the batch end all-reduces exact fixed-point tallies). Under --nightly the
`batch` advantage (batch-wide mean and std, float tallies) is run in 2 processes too; in
`make test` its batch-end exchange is tests/schedule/data_parallel_test.py's.
The warm start is trained once per family for the whole session and shared through
`sft.cache_dir` (TSJ_TEST_SFT_CACHE, tests/conftest.py): GRPO at seed 42 and OPD at its
config's seed, as in tests/train_test.py.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from thundersync_jax.metrics import read_metrics

# The module fixture runs three trainings; on a loaded 2-core machine that passed 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2
FAMILIES = {
    "grpo": ("experiments.swe_grpo", "configs/cpu.py:smoke"),
    "opd": ("experiments.terminal_opd", "configs/terminal_opd_cpu.py:smoke"),
}
# The seeds of tests/train_test.py's runs, so every family trains one warm start per session
# (cpu.py:smoke holds mixed groups at seed 42; terminal_opd_cpu keeps its own seed).
SEED_FLAGS = {"grpo": ["--config.seed=42"], "opd": []}
# GRPO's 2-process run keeps exact tallies (test_deterministic_...); OPD's keeps float ones.
DETERMINISTIC = {"grpo": ["--config.rl.deterministic=True"], "opd": []}
# The family whose 2-process run is SIGKILLed and resumed in `make test`: GRPO's, whose
# resumed result is then checked bitwise (the kill, the launcher's stop and the resume are
# family-independent: train.py restores a whole train state whatever the algorithm). OPD's
# run is killed too under --nightly.
KILLED = ("grpo",)


def _command(algo, workdir, base, processes, launch_local, steps=STEPS):
    """The run's command line; with several processes, through `launch_local` (the conftest
    fixture: 4 fake devices per process) with an fsdp=2 x tp=2 mesh each."""
    module, config = FAMILIES[algo]
    cmd = [sys.executable, "-m", module, f"--config={config}", f"--workdir={workdir}",
           "--config.schedule=stream", f"--config.num_steps={steps}", *SEED_FLAGS[algo],
           f"--config.sft.cache_dir={os.environ.get('TSJ_TEST_SFT_CACHE') or base / 'sft'}",
           "--config.checkpoint.every=1",
           f"--config.rollout.snapshot_root={base / 'shm'}", "--config.metrics.tensorboard=False",
           "--config.metrics.timeline_every=0"]  # fmt: skip
    if processes == 1:
        return cmd
    return [*launch_local(processes, grace_s=5), *cmd, "--config.mesh.fsdp=2", "--config.mesh.tp=2",
            "--config.distributed.debug_check_replicas=True"]  # fmt: skip


def _run(cmd, timeout=1500):
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def _final(workdir):
    return load_file(os.path.join(workdir, "final", "model.safetensors"))


def _dist(a, b):
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))


def _rewards(workdir):
    return [m["reward_mean"] for m in read_metrics(os.path.join(workdir, "metrics.jsonl"))]


# OPD's 2-process run is nightly (~120 s): the loop, the launcher and the resume around the
# batch end are the same code for both families (GRPO's run proves them), and OPD's own part
# of the batch end (its token-mean totals, the reverse-KL merge) is proved in two processes by
# tests/schedule/data_parallel_test.py.
FAMILY_PARAMS = [pytest.param("grpo"), pytest.param("opd", marks=pytest.mark.nightly)]


@pytest.fixture(scope="module", params=FAMILY_PARAMS)
def runs(request, tmp_path_factory, warm_start, shared_run, launch_local):
    """(algo, base, {"init", "one", "two": workdir}, kill); "init": the session's warm start,
    "one": the session's one-process stream run of this config (conftest `shared_run`, also
    tests/train_test.py's stream schedule), "two": the 2-process run, killed in step 2 and
    resumed (`kill`: what the kill did)."""
    algo, base = request.param, tmp_path_factory.mktemp(request.param)
    wd = {"init": warm_start(algo), "one": shared_run(algo), "two": str(base / "two")}
    cmd = [*_command(algo, wd["two"], base, 2, launch_local), *DETERMINISTIC[algo]]
    if algo not in KILLED and not request.config.getoption("--nightly"):
        _run(cmd)
        return algo, base, wd, None
    kill = _killed_in_step_two_then_resumed(cmd, wd["two"])
    return algo, base, wd, kill


def _killed_in_step_two_then_resumed(cmd, workdir):
    """Runs `cmd` (launch_local, 2 processes), SIGKILLs process 1 once the step-1 checkpoint
    exists, checks the launcher ended the run, then relaunches it to the end."""
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    first = os.path.join(workdir, "checkpoints", "1")
    deadline = time.time() + 900
    while not os.path.isdir(first) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # somewhere inside the next step
    assert proc.poll() is None, f"the run ended before the kill (rc {proc.returncode})"
    os.kill(_process_pid(proc.pid, index=1), signal.SIGKILL)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)  # no hang: the launcher stops process 0
    kill = {"returncode": proc.returncode, "stop_s": time.monotonic() - t0, "stderr": err,
            "final_before_resume": os.path.exists(os.path.join(workdir, "final"))}  # fmt: skip
    _run(cmd)
    return kill


def test_two_processes_end_at_the_one_process_parameters(runs):
    algo, _, wd, _ = runs
    moved = _dist(_final(wd["one"]), _final(wd["init"]))
    assert moved > 0, algo
    d = _dist(_final(wd["two"]), _final(wd["one"]))
    assert d <= 1e-4 * moved, (algo, d, moved)
    assert _rewards(wd["two"]) == _rewards(wd["one"]), algo
    metrics = read_metrics(os.path.join(wd["two"], "metrics.jsonl"))
    one_metrics = read_metrics(os.path.join(wd["one"], "metrics.jsonl"))
    for m, single in zip(metrics, one_metrics, strict=True):  # process 0 writes every process's
        for name in ("learner_busy_s", "mean_policy_lag", "tokens", "open_groups_peak"):
            assert len(m[f"{name}_per_process"]) == 2, name
        assert sum(m["tokens_per_process"]) == m["tokens"] == single["tokens"]
        assert m["mean_policy_lag"] == single["mean_policy_lag"]


# Nightly: in make test, tests/schedule/data_parallel_test.py proves the exchange itself in two
# real processes (the `batch` advantage's rewards and members, with every other accumulator);
# the loop around it is the one the runs above go through (~120 s for two more launches).
@pytest.mark.nightly
def test_batch_advantage_two_processes_match_one_process(runs, launch_local):
    """`rl.advantage=batch`: the batch's rewards are exchanged at batch end (1 step each)."""
    algo, base, wd, _ = runs
    if algo != "grpo":
        pytest.skip("the batch advantage is GRPO's")
    work = {n: str(base / f"batch_{n}") for n in ("one", "two")}
    for name, processes in (("one", 1), ("two", 2)):
        cmd = _command(algo, work[name], base, processes, launch_local, steps=1)
        _run([*cmd, "--config.rl.advantage=batch"])
    moved = _dist(_final(work["one"]), _final(wd["init"]))
    assert moved > 0
    assert _dist(_final(work["two"]), _final(work["one"])) <= 1e-4 * moved
    assert _rewards(work["two"]) == _rewards(work["one"])


def test_a_killed_process_ends_the_run_and_the_relaunch_resumes(runs):
    """The kill stopped the run quickly and before its end; the resumed run is the one
    `test_two_processes_end_at_the_one_process_parameters` compares (the same workdir)."""
    algo, _, wd, kill = runs
    if kill is None:
        pytest.skip(f"{algo}'s 2-process run is not killed (KILLED); --nightly kills it")
    assert kill["returncode"] != 0 and kill["stop_s"] < 120, (algo, kill["returncode"])
    assert "process 1 killed by signal 9" in kill["stderr"], kill["stderr"][-2000:]
    assert not kill["final_before_resume"], "killed after the last step"
    log = open(os.path.join(wd["two"], "train.log")).read()
    assert "resumed from checkpoint at step 1" in log, algo
    assert [m["step"] for m in read_metrics(os.path.join(wd["two"], "metrics.jsonl"))] == [0, 1]


def test_deterministic_two_processes_are_bitwise_the_one_process_run(runs, deterministic_run):
    # rl.deterministic: the processes all-reduce their exact fixed-point tallies, so the
    # 2-process `stream` run's updates are bitwise those of ONE process on the same 4-device
    # fsdp x tp mesh (same per-trajectory gradient programs) folding every group under `sync`
    # (the session's `deterministic_run`, also tests/train_deterministic_test.py's reference):
    # both steps, through the kill and the resume. GRPO only (the exact sum is
    # family-independent: tests/accumulators/exact_dp_test.py).
    algo, _, wd, _ = runs
    if algo != "grpo":
        pytest.skip("one family suffices for the exact all-reduce (suite time)")
    one = deterministic_run()
    ones, twos = _final(one), _final(wd["two"])
    assert _dist(ones, _final(wd["init"])) > 0, "the deterministic steps did not move"
    assert sorted(ones) == sorted(twos)
    assert all(ones[k].tobytes() == twos[k].tobytes() for k in ones)
    assert _rewards(wd["two"]) == _rewards(one)


def _process_pid(launcher_pid: int, index: int) -> int:
    """The pid of launch_local's child with JAX_PROCESS_ID=index."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == launcher_pid and f"JAX_PROCESS_ID={index}".encode() in environ:
            return int(pid)
    raise AssertionError(f"launch_local {launcher_pid} has no process {index}")
