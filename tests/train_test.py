"""End to end: the one training loop (engine processes, sandboxed tools, verifiers, learner).

GRPO on `configs/cpu.py:smoke` with no entropy or KL term: the warm start solves some but
not all members of a group, so the update is the pure policy-gradient term. The float stream
run must move the parameters and end at the synchronous update's (the session's
`deterministic_run`: sync on exact tallies; float32 summation order apart), with identical
per-step rewards; async (on the terminal task family, with shared prompts) reports a policy lag
of 1 in its second step;
(nightly) float sync and group runs the same way, and a run killed with SIGKILL resumes to the
same parameters as an uninterrupted one (make test proves it bitwise:
train_deterministic_test.py, train_multiprocess_test.py). OPD on
`configs/terminal_opd_cpu.py:smoke` the same way (identical tokens and reverse_kl), including
async.

The warm starts (and OPD's teacher) are the session's (conftest `warm_start`,
TSJ_TEST_SFT_CACHE): the SFT cache is keyed by config and data, so a hit is the same model.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import load_file

from configs import cpu, terminal_opd_cpu
from thundersync_jax import train
from thundersync_jax.metrics import read_metrics

# Each module-scoped fixture runs five training runs with engine processes: minutes on 2
# idle cores, far more on a shared box, so past the suite's per-test default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

STEPS = 2
AUTO_STEPS = 3  # the OPD `auto` run: step 0 and 1 explore, step 2 follows the predictor
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = (
    "step step_time_s rollout_time_s learner_busy_s learner_idle_frac tail_s publish_s "
    "max_policy_lag mean_policy_lag open_groups_peak accum_bytes_peak reward_mean tokens "
    "compiles mixed_groups verifier_failures"
).split()


def _grpo_config(schedule, steps, base):
    c = cpu.get_config("smoke")
    c.schedule = schedule
    c.num_steps = steps
    c.seed = 42
    c.rl.entropy_coef = 0.0
    c.rl.kl_coef = 0.0
    c.sft.cache_dir = os.environ.get("TSJ_TEST_SFT_CACHE") or str(base / "sft")
    c.rollout.snapshot_root = str(base / "shm")
    c.metrics.timeline_every = 0
    c.metrics.tensorboard = False
    return c


def _final(workdir):
    return load_file(os.path.join(workdir, "final", "model.safetensors"))


def _metrics(workdir):
    return read_metrics(os.path.join(workdir, "metrics.jsonl"))


def _dist(a, b):
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))


def _assert_schedules_agree(wd, same_keys):
    init, sync = _final(wd["init"]), _final(wd["sync"])
    moved = _dist(sync, init)
    assert moved > 0
    lag0 = [s for s in ("sync", "group", "stream") if s in wd]
    for schedule in lag0[1:]:
        d = _dist(_final(wd[schedule]), sync)
        assert d <= 1e-3 * moved, (schedule, d, moved)
    for key in same_keys:
        got = {s: [m[key] for m in _metrics(wd[s])] for s in lag0}
        assert all(got[s] == got["sync"] for s in lag0), (key, got)
        assert len(got["sync"]) == STEPS
    for s in lag0:
        _assert_steps_and_lags(s, wd[s], STEPS)


def _assert_steps_and_lags(schedule, workdir, steps):
    """`steps` steps, each with every metric of NAMES, each trained on its own policy's
    samples but async's step 1 (step 0 trains on the batch its own policy sampled, step 1 on
    policy 0's)."""
    ms = _metrics(workdir)
    assert [m["step"] for m in ms] == list(range(steps)), schedule
    for m in ms:
        assert set(NAMES) <= set(m), (schedule, set(NAMES) - set(m))
    lags = [m["max_policy_lag"] for m in ms]
    assert lags == ([0, 1] if schedule == "async" else [0] * steps), (schedule, lags)


def _assert_exact_engine_logprobs(wd):
    """The embedded engine runs the learner's model: its log-probs of its own samples match
    the learner's score-gradient forward (measured 4.0e-7 mean, 4.1e-6 max nats, BENCHMARKS
    issue 18 session 6), every step of every schedule that trains on its own policy's samples.
    A lagged step (async, policy lag 1) was sampled at the previous θ: its gap is real."""
    for s, workdir in wd.items():
        for m in _metrics(workdir) if s != "init" else ():
            assert m["engine_logprob_gap_abs"] >= 0 and m["engine_logprob_gap_kl"] >= 0
            if m["max_policy_lag"]:
                continue
            assert m["engine_logprob_gap_abs"] < 1e-5, (s, m["engine_logprob_gap_abs"])
            assert m["engine_logprob_gap_max"] < 1e-3 and m["engine_logprob_gap_kl"] < 1e-6


def _run_every_schedule(make_config, base, init, stream, schedules):
    """{"init": the warm start exported (the session's, conftest `warm_start`), "stream": the
    session's shared stream run (conftest `shared_run`, the same config; None: no stream
    run), schedule: workdir after STEPS steps}."""
    out = {"init": init}
    if stream is not None:
        _assert_same_config(make_config("stream", STEPS, base), stream)
        out["stream"] = stream
    for schedule in schedules:
        out[schedule] = str(base / schedule)
        train.run(make_config(schedule, STEPS, base), out[schedule])
    return out


# Where the shared run may differ from this module's own stream config: paths and outputs.
_NOT_COMPARED = {("sft", "cache_dir"), ("rollout", "snapshot_root"), ("metrics", "tensorboard"),
                 ("checkpoint", "every")}  # fmt: skip


def _assert_same_config(config, workdir):
    """The shared run (its config.json) is this module's stream config but for _NOT_COMPARED."""
    with open(os.path.join(workdir, "config.json")) as f:
        theirs = json.load(f)
    ours = json.loads(config.to_json_best_effort())
    for section, keys in ours.items():
        for key, value in keys.items() if isinstance(keys, dict) else [(None, keys)]:
            if (section, key) in _NOT_COMPARED:
                continue
            got = theirs[section] if key is None else theirs[section][key]
            assert got == value, (section, key, got, value)


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory, warm_start, shared_run, deterministic_run):
    # The synchronous reference is the session's `deterministic_run` (tests/conftest.py: this
    # config's `sync` on exact tallies, one process on a 4-device mesh): the float `stream` run
    # must end within 1e-3 of its update with the same rewards, tokens and mixed groups.
    # sync = group = stream is proved bitwise end to end (tests/train_deterministic_test.py,
    # tests/train_multiprocess_test.py) and in float at planner level
    # (tests/algorithms/grpo_test.py); the schedule does not depend on the tallies' number
    # format, so the float `sync` and `group` runs are nightly.
    base = tmp_path_factory.mktemp("grpo")
    init, stream = warm_start("grpo"), shared_run("grpo")
    runs = _run_every_schedule(_grpo_config, base, init, stream, schedules=())
    return base, {**runs, "sync": deterministic_run()}


@pytest.mark.nightly
def test_grpo_group_schedule_reaches_the_sync_parameters(grpo_runs):
    base, wd = grpo_runs
    group = str(base / "group")
    train.run(_grpo_config("group", STEPS, base), group)
    _assert_schedules_agree({**wd, "group": group}, ("reward_mean", "tokens", "mixed_groups"))


def test_grpo_schedules_reach_the_same_parameters_on_a_pure_pg_update(grpo_runs):
    _, wd = grpo_runs
    # The update is the GRPO term alone, so some group had mixed rewards.
    assert any(m["mixed_groups"] > 0 for m in _metrics(wd["sync"]))
    _assert_schedules_agree(wd, ("reward_mean", "tokens", "mixed_groups"))
    _assert_exact_engine_logprobs(wd)


# Folded (issue 23): tests/train_multiprocess_test.py SIGKILLs the deterministic 2-process
# stream run inside step 2 and proves the resumed run bitwise the uninterrupted sync one.
@pytest.mark.nightly
def test_sigkill_and_resume_ends_at_same_parameters(grpo_runs):
    base, _ = grpo_runs
    float_sync = str(base / "float_sync")
    train.run(_grpo_config("sync", STEPS, base), float_sync)
    work = str(base / "killed")
    cmd = [
        sys.executable,
        "-m",
        "experiments.swe_grpo",
        "--config=configs/cpu.py:smoke",
        f"--workdir={work}",
        "--config.schedule=sync",
        f"--config.num_steps={STEPS}",
        "--config.seed=42",
        f"--config.sft.cache_dir={os.environ.get('TSJ_TEST_SFT_CACHE') or base / 'sft'}",
        f"--config.rollout.snapshot_root={base / 'shm'}",
        "--config.checkpoint.every=1",
        "--config.metrics.timeline_every=0",
        "--config.metrics.tensorboard=False",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ckpt0 = os.path.join(work, "checkpoints", "1")
    deadline = time.time() + 600
    while not os.path.isdir(ckpt0) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # kill somewhere inside the next step
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=900)
    # sync's chunk order is fixed, so the resumed run is bitwise the uninterrupted one
    d = _dist(_final(work), _final(float_sync))
    assert d == 0.0, d
    assert [m["step"] for m in _metrics(work)] == list(range(STEPS))


def test_entry_point_and_config_mismatch_is_a_clear_error(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "experiments.swe_grpo",
        "--config=configs/terminal_opd_cpu.py:smoke",
        f"--workdir={tmp_path / 'run'}",
    ]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "rl.algorithm='opd' but this entry point runs 'grpo'" in res.stderr
    assert not (tmp_path / "run").exists()


def test_grpo_async_on_terminal_tasks_with_shared_prompts(tmp_path):
    """GRPO's `async` schedule (one run proves its lag and the terminal family with shared
    prompts: one launch instead of two, issue 23): step 0 trains on its own policy's samples,
    step 1 on step 0's policy's (lag 1), and both update."""
    c = _grpo_config("async", STEPS, tmp_path)
    # Checked for its lag and metrics, not compared: one group of 4, with the entropy term so
    # that step 0 updates even when the group's rewards tie, and step 1 really trains on the
    # previous policy's samples.
    c.rl.num_groups, c.rl.entropy_coef = 1, 0.01
    c.env.family = "terminal"
    c.sft.steps = 4  # plumbing: the terminal family's tasks, demonstrations and verifier
    c.rl.shared_prompt = True  # and each group's prompt forwarded / backpropagated once
    wd = str(tmp_path / "run")
    train.run(c, wd)
    _assert_steps_and_lags("async", wd, STEPS)
    ms = _metrics(wd)
    assert [m["mean_policy_lag"] for m in ms] == [0.0, 1.0]
    assert not any(m["update_skipped"] for m in ms)  # step 1's samples really are stale
    for m in ms:
        assert m["tokens"] > 0 and m["rollout_failures"] == 0 and np.isfinite(m["grad_norm"])
    # The members' segment forwards give the gap too: the embedded engine's is ~0 for the
    # samples of the policy being trained; step 1's were sampled at step 0's θ and its gap
    # sees the update in between.
    assert 0 <= ms[0]["engine_logprob_gap_abs"] < 1e-5 and ms[0]["engine_logprob_gap_kl"] < 1e-6
    assert ms[1]["engine_logprob_gap_abs"] > 1e-5, ms[1]["engine_logprob_gap_abs"]
    assert os.path.exists(os.path.join(wd, "final", "model.safetensors"))


def _opd_config(schedule, steps, base):
    c = terminal_opd_cpu.get_config("smoke")
    c.schedule = schedule
    c.num_steps = steps
    c.sft.cache_dir = os.environ.get("TSJ_TEST_SFT_CACHE") or str(base / "sft")
    c.rollout.snapshot_root = str(base / "shm")
    c.metrics.timeline_every = 0
    return c


@pytest.fixture(scope="module")
def opd_runs(tmp_path_factory, warm_start):
    # group is left to tests/algorithms/opd_test.py (the same planner path, no engines)
    base = tmp_path_factory.mktemp("opd")
    runs = _run_every_schedule(_opd_config, base, warm_start("opd"), None, ("sync", "async"))
    # The streamed run: granularity chosen per step by the predictor (3 steps: two explore,
    # then it predicts). Step 0 runs the rule's `turn` granularity (per-turn segments over the
    # learner's cache) and step 1 `trajectory` granularity (one gradient per trajectory when
    # it ends): each step's update is checked against sync's, so this one run stands for a
    # 2-step `turn` stream run and a `trajectory` run (suite time, issue 23).
    c = _opd_config("stream", AUTO_STEPS, base)
    c.rl.opd_granularity = "auto"
    c.checkpoint.keep = AUTO_STEPS  # every step's parameters, for the per-step comparison
    runs["auto"] = str(base / "auto")
    train.run(c, runs["auto"])
    return runs


def test_opd_schedules_reach_the_same_parameters(opd_runs):
    # Streamed OPD vs sync, step by step: `turn` granularity in step 0, `trajectory` in step 1;
    # after each, within 1e-3 of an update (sync's second: Adam without warmup, so both of
    # sync's updates have the same scale) of sync's parameters, with identical tokens,
    # reverse_kl, turns and rewards.
    ms, sync = _metrics(opd_runs["auto"]), _metrics(opd_runs["sync"])
    assert [m["opd_granularity_turn"] for m in ms[:STEPS]] == [1.0, 0.0]
    sync_params = {n: _checkpoint_params(opd_runs["sync"], n) for n in (1, 2)}
    update = _dist(sync_params[2], sync_params[1])
    assert update > 0 and _dist(_final(opd_runs["sync"]), _final(opd_runs["init"])) > 0
    for n in (1, 2):
        d = _dist(_checkpoint_params(opd_runs["auto"], n), sync_params[n])
        assert d <= 1e-3 * update, (n, d, update)
    for key in ("tokens", "reverse_kl", "turns", "reward_mean"):
        assert [m[key] for m in ms[:STEPS]] == [m[key] for m in sync], key
    for s, steps in (("sync", STEPS), ("async", STEPS), ("auto", AUTO_STEPS)):
        _assert_steps_and_lags(s, opd_runs[s], steps)
    _assert_exact_engine_logprobs(opd_runs)
    # async step 1 trains θ_1 on turns sampled at θ_0 (measured gap 0.0217 nats/token): the
    # gap metric sees the staleness that the exact steps do not have.
    assert _metrics(opd_runs["async"])[1]["engine_logprob_gap_abs"] > 1e-4
    assert all(np.isfinite(m["reverse_kl"]) for m in _metrics(opd_runs["async"]))


def test_opd_auto_explores_then_follows_the_predictor(opd_runs):
    # Under stream step 0 runs the rule (turn), step 1 the other granularity, step 2 the
    # shorter of the two predictions from the earlier steps' timed calls (unless a call kind
    # only ran while compiling: then it explores that granularity again, no prediction).
    ms = _metrics(opd_runs["auto"])
    assert all("opd_predicted_step_s_turn" not in m for m in ms[:2])
    predicted = [m for m in ms[2:] if "opd_predicted_step_s_turn" in m]
    assert predicted, "no step followed the predictor"
    for m in predicted:
        turn, traj = m["opd_predicted_step_s_turn"], m["opd_predicted_step_s_trajectory"]
        assert 0 < min(turn, traj) and m["opd_granularity_turn"] == float(turn <= traj)
    with open(os.path.join(opd_runs["auto"], "train.log")) as f:
        log = f.read()
    assert "OPD granularity at version 2: " in log
    # the open trajectories' learner caches are counted (`trajectory`, step 1, keeps none)
    assert _metrics(opd_runs["sync"])[1]["accum_bytes_peak"] > ms[1]["accum_bytes_peak"]


def _checkpoint_params(workdir, step):
    """The trainable parameters of `workdir`'s checkpoint after `step` updates (the smoke
    configs checkpoint every step and keep two), by pytree path."""
    restored = ocp.StandardCheckpointer().restore(
        os.path.join(workdir, "checkpoints", str(step), "default")
    )
    leaves = jax.tree_util.tree_leaves_with_path(restored["params"])
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}
