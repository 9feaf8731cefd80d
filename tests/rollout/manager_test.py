"""EngineManager: kill -9 an engine mid-request; the restarted engine gives the same tokens."""

import os
import queue
import signal

import pytest
from flax import nnx

from thundersync_jax.models import sampling
from thundersync_jax.rollout import EngineManager, GenerateRequest, check_version


def _requests(prefix, n, max_new_tokens):
    sp = sampling.SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    return [
        GenerateRequest(f"{prefix}{i}", [3 + i, 1, 4, 1, 5], sp, (9, 1, i, 0)) for i in range(n)
    ]


@pytest.mark.slow
def test_killed_engine_is_restarted_reloaded_and_retried_with_the_same_keys(tiny, tmp_path):
    model = tiny.model(seed=21, sharp=True)
    params = nnx.split(model, nnx.Param)[1]
    mgr = EngineManager(
        tiny.server_args(),
        num_engines=1,
        heartbeat_s=0.1,
        heartbeat_timeout_s=5.0,
        env=tiny.server_env(),
    ).start()
    try:
        path = mgr.publish(params, 1, str(tmp_path / "snapshots"))
        assert mgr.version == 1 and path.endswith("v1")
        # The same requests before the crash: the reference trajectories (and a warm engine).
        before = {r.request_id[1:]: r for r in mgr.generate(_requests("a", 4, 40))}
        assert all(r.ok and r.policy_version == 1 for r in before.values())

        # One short request finishes after the prefill step; the moment its result arrives the
        # long ones are mid-generation, and the engine is killed.
        old_pid = mgr.pids[0]
        results: queue.SimpleQueue = queue.SimpleQueue()
        arrived_after_kill = {}

        def on_result(res):
            if res.request_id == "short":
                os.kill(old_pid, signal.SIGKILL)
            else:
                arrived_after_kill[res.request_id] = True
            results.put(res)

        short = _requests("short", 1, 1)[0]
        short = GenerateRequest("short", [7, 7], short.sampling, (9, 1, 99, 0))
        mgr.submit([short, *_requests("b", 4, 40)], on_result)
        got = {}
        for _ in range(5):
            res = results.get(timeout=120)
            got[res.request_id] = res
        assert mgr.restarts == [1] and mgr.pids[0] != old_pid
        for i in range(4):
            res, want = got[f"b{i}"], before[str(i)]
            assert res.ok, res.error
            assert res.tokens == want.tokens and len(res.tokens) == 40
            assert res.logprobs == pytest.approx(want.logprobs, abs=1e-6)
            check_version(res.policy_version, 1)  # the restarted engine reloaded v1
        assert set(arrived_after_kill) == {f"b{i}" for i in range(4)}

        # A hung engine (SIGSTOP: alive, silent) misses its heartbeats and is replaced too.
        hung_pid = mgr.pids[0]
        os.kill(hung_pid, signal.SIGSTOP)
        (res,) = mgr.generate(_requests("c", 1, 40))
        assert res.tokens == before["0"].tokens and res.policy_version == 1
        assert mgr.restarts == [2] and mgr.pids[0] != hung_pid
        new_pid = mgr.pids[0]
    finally:
        mgr.close()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in (old_pid, hung_pid, new_pid))


def test_engine_that_cannot_start_fails_clearly(tiny):
    mgr = EngineManager(["--max-batch", "0", "--model-config", "{}"], env=tiny.server_env())
    with pytest.raises(Exception, match="did not start"):
        mgr.start()
