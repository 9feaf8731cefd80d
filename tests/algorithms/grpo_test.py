"""GRPO's learner path (planner → packed score-gradient chunks → accumulator) is exact.

Every schedule, fed the same trajectories in a random arrival order, must give
the float64 batch-synchronous update computed from one-trajectory gradients.
"""

import dataclasses
import queue

import jax
import numpy as np
import pytest

from thundersync_jax import accumulators
from thundersync_jax.algorithms import grpo
from thundersync_jax.learner import chunks
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.losses.logprob_gap import GapTally
from thundersync_jax.rollout.staleness import StalePolicyError
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.planner import Planner, WorkItem

K, G = 3, 3


@dataclasses.dataclass
class _Traj:
    tokens: np.ndarray
    loss_mask: np.ndarray
    reward: float
    policy_versions: tuple = (0,)
    logprobs: np.ndarray | None = None  # the engine's; None: an engine that gave none


@pytest.fixture(scope="module")
def setup(tiny_policy):
    cfg, graphdef, params = tiny_policy(0)
    score_fn = chunks.make_score_grad_fn(graphdef, seq_buckets=(16, 32), pad_id=0)
    rng = np.random.default_rng(7)
    rewards = [[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.0, 1.0, 0.25]]  # group 1: all tied
    trajs = {}
    for k in range(K):
        for m in range(G):
            n = int(rng.integers(8, 30))
            prompt = int(rng.integers(2, 5))
            mask = np.zeros(n, np.float32)
            mask[prompt:] = 1
            tokens = rng.integers(1, cfg.vocab_size, size=n).astype(np.int32)
            trajs[(k, m)] = _Traj(tokens, mask, rewards[k][m])
    return params, score_fn, trajs


def _run(schedule, params, score_fn, trajs, order, loss_agg, max_items=None, placement="device"):
    """(∇L, metrics) of one batch fed in `order` through the planner under `schedule`."""
    acc = accumulators.grpo(
        num_groups=K, group_size=G, loss_agg=loss_agg, max_len=32, placement=placement
    )
    learner = grpo.batch_learner(acc, score_fn, pad_id=0)
    q: queue.Queue = queue.Queue()
    for t, (k, m) in enumerate(order):
        tr = trajs[(k, m)]
        q.put(WorkItem(f"g{k}m{m}", k, tr.reward, int(tr.loss_mask.sum()), float(t), payload=tr))
    planner = Planner(schedule, K, G, max_chunk_tokens=64, max_chunk_items=max_items)
    state, _ = run_learner_batch(planner, q, learner.init(params, 0), learner.process)
    return learner.finalize(state), learner.metrics(state)


# token-mean in make test, not test-quick (the default aggregation stays quick; every
# aggregation's exactness is also tests/accumulators/grpo_deterministic_test.py's, quick)
@pytest.mark.parametrize(
    "loss_agg", ["seq-mean-token-mean", pytest.param("token-mean", marks=pytest.mark.slow)]
)
def test_every_schedule_matches_synchronous_reference(setup, loss_agg):
    params, score_fn, trajs = setup
    ref_in = []
    for (k, _m), tr in sorted(trajs.items()):
        h, n = score_fn(params, tr.tokens[None], tr.loss_mask[None])
        ref_in.append((k, tr.reward, jax.tree.map(np.asarray, h), n))
    want = accumulators.reference.grpo_gradient(ref_in, loss_agg=loss_agg, max_len=32)
    rng = np.random.default_rng(0)
    keys = sorted(trajs)
    for schedule in ("sync", "group", "stream", "async"):
        order = [keys[i] for i in rng.permutation(len(keys))]
        got, metrics = _run(schedule, params, score_fn, trajs, order, loss_agg)
        err = accumulators.reference.relative_error(got, want)
        assert err < 1e-5, (schedule, err)
        assert metrics["mixed_groups"] == 2  # group 1's rewards tie
        assert metrics["reward_mean"] == pytest.approx(np.mean([t.reward for t in trajs.values()]))
        assert metrics["max_policy_lag"] == metrics["mean_policy_lag"] == 0
        assert "engine_logprob_gap_abs" not in metrics  # no engine log-probs: absent, not 0


def test_host_tallies_stream_run_equals_device_tallies_run(setup):
    """accum.placement='host': the stream learner ends at the device-tally run's bits."""
    params, score_fn, trajs = setup
    keys = sorted(trajs)
    order = [keys[i] for i in np.random.default_rng(1).permutation(len(keys))]
    runs = {
        placement: _run("stream", params, score_fn, trajs, order, "token-mean", placement=placement)
        for placement in ("device", "host")
    }
    (device, device_metrics), (host, host_metrics) = runs["device"], runs["host"]
    for a, b in zip(jax.tree.leaves(device), jax.tree.leaves(host), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert host_metrics == device_metrics


def test_one_item_chunks_under_deterministic(setup):
    """rl.deterministic: every call holds one trajectory, and the update is the same."""
    params, score_fn, trajs = setup
    keys = sorted(trajs)
    want, _ = _run("sync", params, score_fn, trajs, keys, "seq-mean-token-mean")
    rows = []

    class Counting:
        compiles = 0

        def score_and_gap(self, p, tokens, *args, **kwargs):
            rows.append(len(tokens))
            return score_fn.score_and_gap(p, tokens, *args, **kwargs)

    got, _ = _run("stream", params, Counting(), trajs, keys, "seq-mean-token-mean", 1)
    assert rows == [1] * len(keys)
    assert accumulators.reference.relative_error(got, want) < 1e-5


def test_stale_trajectory_is_rejected(setup):
    params, score_fn, trajs = setup
    acc = accumulators.grpo(num_groups=K, group_size=G)
    learner = grpo.batch_learner(acc, score_fn, pad_id=0)
    tr = trajs[(0, 0)]
    item = WorkItem("g0m0", 0, tr.reward, 5, 0.0, payload=tr)
    with pytest.raises(StalePolicyError, match="version 0 but the learner is at version 3"):
        learner.process(learner.init(params, 3), [item])
    # async does not enforce the version: it records the lag instead
    state = learner.process(learner.init(params, 3, enforce_version=False), [item])
    assert learner.metrics(state)["max_policy_lag"] == 3


def test_lost_member_closes_its_group_short(setup):
    """A rollout that fails for good shrinks its group; the update uses the members it has."""
    from thundersync_jax.schedule.learner_loop import MemberFailed

    params, score_fn, trajs = setup
    lost = (2, 1)
    kept = {km: tr for km, tr in trajs.items() if km != lost}
    ref_in = []
    for (k, _m), tr in sorted(kept.items()):
        h, n = score_fn(params, tr.tokens[None], tr.loss_mask[None])
        ref_in.append((k, tr.reward, jax.tree.map(np.asarray, h), n))
    want = accumulators.reference.grpo_gradient(ref_in)
    acc = accumulators.grpo(num_groups=K, group_size=G)
    learner = grpo.batch_learner(acc, score_fn, pad_id=0)
    q: queue.Queue = queue.Queue()
    for t, ((k, m), tr) in enumerate(sorted(kept.items())):
        q.put(WorkItem(f"g{k}m{m}", k, tr.reward, int(tr.loss_mask.sum()), float(t), payload=tr))
    q.put(MemberFailed(group=lost[0], reason="engine gave up"))
    planner = Planner("stream", K, G, max_chunk_tokens=64)
    state, stats = run_learner_batch(planner, q, learner.init(params, 0), learner.process)
    assert stats.failed_groups == {lost[0]}
    state = learner.close_groups(state, stats.failed_groups)
    err = accumulators.reference.relative_error(learner.finalize(state), want)
    assert err < 1e-5, err


def test_a_trajectory_that_mixes_policy_versions_is_refused_in_every_schedule(setup):
    params, score_fn, trajs = setup
    learner = grpo.batch_learner(accumulators.grpo(num_groups=K, group_size=G), score_fn, 0)
    tr = dataclasses.replace(trajs[(0, 0)], policy_versions=(2, 3))
    item = WorkItem("g0m0", 0, tr.reward, 5, 0.0, payload=tr)
    with pytest.raises(StalePolicyError, match=r"mixes policy versions \[2, 3\]"):
        learner.process(learner.init(params, 3, enforce_version=False), [item])


@dataclasses.dataclass
class _PromptedTraj(_Traj):
    prompt_len: int = 0


def _prompted_trajs(cfg, rng) -> dict:
    """K groups of G members sharing their group's prompt; an observation in each completion."""
    trajs = {}
    for k in range(K):
        prompt = rng.integers(1, cfg.vocab_size, size=int(rng.integers(3, 9))).astype(np.int32)
        for m in range(G):
            rest = rng.integers(1, cfg.vocab_size, size=int(rng.integers(4, 20))).astype(np.int32)
            tokens = np.concatenate([prompt, rest])
            mask = np.zeros(len(tokens), np.float32)
            mask[len(prompt) :] = 1
            mask[len(prompt) + 2 : len(prompt) + 4] = 0  # an observation inside the completion
            trajs[(k, m)] = _PromptedTraj(
                tokens, mask, float(rng.integers(0, 3)), (0,), prompt_len=len(prompt)
            )
    return trajs


@pytest.mark.parametrize(
    "advantage,tis_cap",
    [
        # grpo without a cap in make test, not test-quick: grpo-2.0 runs the same path with the
        # importance cap on top
        pytest.param("grpo", 0.0, marks=pytest.mark.slow),
        ("batch", 0.0),
        ("grpo", 2.0),
    ],
)
def test_shared_prompts_match_synchronous_reference(setup, tiny_policy, advantage, tis_cap):
    """`rl.shared_prompt`: each group's prompt forwarded and backpropagated once, members'
    prompt cotangents in two tallies: the same update as per-member full-trajectory chunks.
    With `tis_cap` and engine log-probs off the learner's, the members' direct passes weight
    their tokens (and so their prompt cotangents) like the chunk does, and give its gap."""
    from thundersync_jax.algorithms import _grpo_prompts
    from thundersync_jax.learner import segments

    params, score_fn, _ = setup
    cfg, graphdef, _ = tiny_policy(0)
    rng = np.random.default_rng(3)
    trajs = _prompted_trajs(cfg, rng)
    chunk_fn = score_fn
    if tis_cap:
        chunk_fn = chunks.make_score_grad_fn(graphdef, (16, 32), pad_id=0, tis_cap=tis_cap)
        logprob_fn = TokenLogprobFn(score_fn)
        for km, tr in trajs.items():
            learner_lp = np.asarray(logprob_fn(params, tr.tokens[None])[0])
            noisy = (learner_lp + rng.normal(0, 0.5, learner_lp.shape)) * tr.loss_mask
            trajs[km] = dataclasses.replace(tr, logprobs=noisy.astype(np.float32))
    ref_in, gap = [], GapTally()
    for (k, _m), tr in sorted(trajs.items()):
        engine = None if tr.logprobs is None else tr.logprobs[None]
        h, n, g = chunk_fn.score_and_gap(params, tr.tokens[None], tr.loss_mask[None], None, engine)
        ref_in.append((k, tr.reward, jax.tree.map(np.asarray, h), n))
        gap = gap.add(g)
    kw = dict(advantage=advantage, loss_agg="seq-mean-token-mean", max_len=32)
    want = accumulators.reference.grpo_gradient(ref_in, **kw)
    acc = accumulators.grpo(num_groups=K, group_size=G, **kw)
    assert _grpo_prompts.uses_shared_prompts(acc, None, deterministic=False)
    fns = segments.make_segment_fns(
        graphdef, cfg, seg_buckets=(8, 32), cache_buckets=(32,), tis_cap=tis_cap
    )
    learner = _grpo_prompts.batch_learner(acc, fns, G)
    keys = sorted(trajs)
    for schedule in ("stream", "sync"):
        q: queue.Queue = queue.Queue()
        for t, i in enumerate(rng.permutation(len(keys))):
            k, m = keys[i]
            tr = trajs[(k, m)]
            q.put(
                WorkItem(f"g{k}m{m}", k, tr.reward, int(tr.loss_mask.sum()), float(t), tr, True, m)
            )
        planner = Planner(schedule, K, G, max_chunk_tokens=64)
        state, _ = run_learner_batch(planner, q, learner.init(params, 0), learner.process)
        if advantage == "grpo":
            assert not state.groups  # each prompt was backpropagated as its group completed
        state = learner.close_groups(state, set())
        err = accumulators.reference.relative_error(learner.finalize(state), want)
        assert err < 1e-5, (schedule, err)
        assert learner.kept_bytes_peak(state) > 0
        metrics = learner.metrics(state)
        if not tis_cap:
            assert "engine_logprob_gap_abs" not in metrics  # no engine log-probs: absent
            continue
        for key, value in gap.metrics().items():  # the chunk path's gap, from the segments
            assert metrics[key] == pytest.approx(value, rel=1e-4), key
    if tis_cap:  # the weight changed the update (the reference is not the uncorrected one)
        off = [(k, tr.reward, score_fn(params, tr.tokens[None], tr.loss_mask[None]))
               for (k, _m), tr in sorted(trajs.items())]  # fmt: skip
        off = [(k, r, jax.tree.map(np.asarray, h), n) for k, r, (h, n) in off]
        plain = accumulators.reference.grpo_gradient(off, **kw)
        assert accumulators.reference.relative_error(want, plain) > 1e-2


def test_truncated_importance_weight_streams_exactly_and_reports_the_gap(setup, tiny_policy):
    """rl.tis_cap with engine log-probs that differ from the learner's: every schedule gives
    the reference built from one-trajectory weighted gradients, which differs from the
    uncorrected update; the step's gap metrics are the float64 ones over all tokens."""
    params, score_fn, trajs = setup
    _, graphdef, _ = tiny_policy(0)
    tis = chunks.make_score_grad_fn(graphdef, seq_buckets=(16, 32), pad_id=0, tis_cap=2.0)
    logprob_fn = TokenLogprobFn(score_fn)
    rng = np.random.default_rng(11)
    engine_trajs, deltas = {}, []
    for km, tr in trajs.items():
        learner_lp = logprob_fn(params, tr.tokens[None])[0].astype(np.float64)
        engine_lp = (learner_lp + rng.normal(0, 0.5, learner_lp.shape)) * tr.loss_mask
        engine_trajs[km] = dataclasses.replace(tr, logprobs=engine_lp.astype(np.float32))
        deltas.append((engine_lp.astype(np.float32) - learner_lp)[tr.loss_mask > 0])
    ref_tis, ref_off = [], []
    for (k, _m), tr in sorted(engine_trajs.items()):
        h, n, _ = tis.score_and_gap(
            params, tr.tokens[None], tr.loss_mask[None], None, tr.logprobs[None]
        )
        ref_tis.append((k, tr.reward, jax.tree.map(np.asarray, h), n))
        h, n = score_fn(params, tr.tokens[None], tr.loss_mask[None])
        ref_off.append((k, tr.reward, jax.tree.map(np.asarray, h), n))
    want = accumulators.reference.grpo_gradient(ref_tis, max_len=32)
    off = accumulators.reference.grpo_gradient(ref_off, max_len=32)
    assert accumulators.reference.relative_error(want, off) > 1e-2
    d = np.concatenate(deltas)
    keys = sorted(engine_trajs)
    for schedule, order in (("sync", keys), ("stream", keys[::-1])):
        # One trajectory per call: the reference's two programs, no new compiles (packed rows
        # with the weight are checked against the reference in tests/learner/logprobs_test.py).
        got, metrics = _run(schedule, params, tis, engine_trajs, order, "seq-mean-token-mean", 1)
        assert accumulators.reference.relative_error(got, want) < 1e-5, schedule
        assert metrics["engine_logprob_gap_abs"] == pytest.approx(np.abs(d).mean(), rel=1e-4)
        kl = (np.expm1(-d) + d).mean()
        assert metrics["engine_logprob_gap_kl"] == pytest.approx(kl, rel=1e-4)
        assert metrics["engine_logprob_gap_max"] == pytest.approx(np.abs(d).max(), rel=1e-4)
