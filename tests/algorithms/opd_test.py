"""On-policy distillation: streamed per-turn updates equal the synchronous full-trajectory update.



OPD gradient written directly with jax.grad: one full-trajectory forward per trajectory, all
turns' tokens masked in, Â = stop_gradient(log π_T − log π_s), −(1/N) Σ Â ∇ log π_s.
The end-to-end runs (engine and teacher processes, sandboxed tasks) are in tests/train_test.py.
"""

import queue

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import terminal_opd_cpu
from thundersync_jax import accumulators, losses, sim, train
from thundersync_jax.algorithms import _opd_auto, opd
from thundersync_jax.algorithms.base import MemberEnd, MemberLost
from thundersync_jax.algorithms.opd import TurnPayload
from thundersync_jax.learner import chunks, segments
from thundersync_jax.models import lora, qwen3
from thundersync_jax.rollout.staleness import StalePolicyError
from thundersync_jax.schedule import schedules
from thundersync_jax.schedule.config_check import ConfigError
from thundersync_jax.schedule.learner_loop import MemberFailed, run_learner_batch
from thundersync_jax.schedule.planner import Planner, WorkItem

K, G = 2, 2
CFG = qwen3.Qwen3Config(
    vocab_size=53,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=1,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=8,
    tie_word_embeddings=True,
)


WIDTH = 32  # every test trajectory fits; one padded width keeps compiles few


def _logprobs(model, tokens: jax.Array) -> jax.Array:
    """[B, W] log π(tokens[:, t] | tokens[:, <t]), 0 at t = 0 (right padding is inert: causal)."""
    lp = losses.token_logprobs(model(tokens[:, :-1]), tokens[:, 1:])
    return jnp.pad(lp, ((0, 0), (1, 0)))


def _padded(trajs) -> tuple[np.ndarray, np.ndarray]:
    """[B, W] tokens and the all-turns mask of every trajectory, right-padded."""
    tokens = np.zeros((len(trajs), WIDTH), np.int32)
    mask = np.zeros((len(trajs), WIDTH), np.float32)
    for row, (toks, spans, _) in enumerate(trajs.values()):
        tokens[row, : len(toks)] = toks
        for s, e in spans:
            mask[row, s:e] = 1
    return tokens, mask


@pytest.fixture(scope="module")
def setup():
    graphdef, params = nnx.split(qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)), nnx.Param)
    t_graphdef, t_params = nnx.split(qwen3.Qwen3(CFG, rngs=nnx.Rngs(1)), nnx.Param)
    rng = np.random.default_rng(11)
    layout = {}
    for k in range(K):
        for m in range(G):
            n_turns = int(rng.integers(1, 4))
            pos = int(rng.integers(3, 6))  # prompt
            spans = []
            for _ in range(n_turns):
                length = int(rng.integers(2, 8))
                spans.append((pos, pos + length))
                pos += length + int(rng.integers(1, 4))  # tool results between turns
            assert pos <= WIDTH
            layout[(k, m)] = (rng.integers(1, CFG.vocab_size, size=pos).astype(np.int32), spans)
    tokens, _ = _padded({km: (t, s, None) for km, (t, s) in layout.items()})
    teacher_lp = jax.jit(lambda p, x: _logprobs(nnx.merge(t_graphdef, p), x))(t_params, tokens)
    trajs = {
        km: (toks, spans, np.asarray(teacher_lp[row, : len(toks)]))
        for row, (km, (toks, spans)) in enumerate(layout.items())
    }
    return graphdef, params, trajs


def _learner(graphdef, granularity, tis_cap=0.0):
    score_fn = chunks.make_score_grad_fn(graphdef, (WIDTH,), pad_id=0, tis_cap=tis_cap)
    seg_fns = segments.make_segment_fns(
        graphdef, CFG, seg_buckets=(8, WIDTH), cache_buckets=(WIDTH,), tis_cap=tis_cap
    )
    return opd.batch_learner(
        accumulators.opd(), score_fn, pad_id=0, segment_fns=seg_fns, granularity=granularity
    )


@pytest.fixture(scope="module")
def learners(setup):
    """One learner per granularity for the whole module, so each compiles once."""
    graphdef, _, _ = setup
    return {g: _learner(graphdef, g) for g in ("turn", "trajectory")}


@pytest.fixture(scope="module")
def learner(learners):
    return learners["turn"]


@pytest.fixture(scope="module")
def reference(setup):
    graphdef, params, trajs = setup
    return _reference(graphdef, params, trajs)


def _reference(graphdef, params, trajs, engine=None, tis_cap=0.0):
    """Batch-synchronous OPD gradient: full-trajectory forward, every turn masked in; with
    `tis_cap`, each token also weighted by min(π_s / π_engine, tis_cap), detached."""
    tokens, mask = _padded(trajs)
    teacher_lp = np.zeros((len(trajs), WIDTH), np.float32)
    for row, (toks, _, t_lp) in enumerate(trajs.values()):
        teacher_lp[row, : len(toks)] = t_lp
    n_total = int(mask.sum())
    engine_lp = np.zeros((len(trajs), WIDTH), np.float32)
    for row, km in enumerate(trajs):
        if engine is not None:
            engine_lp[row] = engine[km][:WIDTH]

    def objective(p):
        lp = _logprobs(nnx.merge(graphdef, p), tokens)
        advantage = jax.lax.stop_gradient(teacher_lp - lp)  # no gradient through Â
        weight = jnp.ones_like(lp)
        if tis_cap:
            weight = jax.lax.stop_gradient(jnp.minimum(jnp.exp(lp - engine_lp), tis_cap))
        return -jnp.sum(advantage * mask * weight * lp) / n_total

    return jax.jit(jax.grad(objective))(params), n_total


def _arrivals(trajs, seed, counted=True, engine=None):
    """Every turn as a WorkItem, member-closing items after their member's turns, shuffled
    under that constraint (turns of different members interleave)."""
    rng = np.random.default_rng(seed)
    per_member = []
    for (k, m), (tokens, spans, t_lp) in trajs.items():
        items = []
        order = rng.permutation(len(spans))  # turns may be scored out of order
        for j in order:
            s, e = spans[j]
            e_lp = None if engine is None else engine[(k, m)][s:e]
            payload = TurnPayload.from_turn(tokens[:e], s, t_lp[s:e], 0, int(j), e_lp)
            items.append(WorkItem(f"g{k}m{m}t{j}", k, 0.0, e - s, 0.0, payload, False, m))
        # group 0's rewards tie, group 1's too; without the turn count the trajectory closes
        # at the batch end (close_groups)
        end = MemberEnd(float(k), None, len(spans) if counted else None)
        items.append(WorkItem(f"g{k}m{m}end", k, 0.0, 0, 0.0, end, True, m))
        per_member.append(items)
    out = []
    while any(per_member):
        live = [i for i, items in enumerate(per_member) if items]
        out.append(per_member[int(rng.choice(live))].pop(0))
    for t, it in enumerate(out):
        it.arrival_s = float(t)
    return out


def _run(
    learner, params, trajs, schedule, seed, max_chunk_tokens=9, counted=True, engine=None, **planner
):
    q: queue.Queue = queue.Queue()
    for it in _arrivals(trajs, seed, counted, engine):
        q.put(it)
    planner = Planner(schedule, K, G, max_chunk_tokens, **planner)
    batch = learner.init(params, 0)
    batch, stats = run_learner_batch(planner, q, batch, learner.process, timeout_s=5)
    if counted:
        assert not batch.open  # every trajectory closed as its last turn came in
    batch = learner.close_groups(batch, set())
    stats.planner = planner
    return learner.finalize(batch), learner.metrics(batch), stats


def _rel_err(a, b) -> float:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    diff = sum(float(jnp.sum((x - y) ** 2)) for x, y in pairs)
    norm = sum(float(jnp.sum(y**2)) for y in jax.tree.leaves(b))
    return float(np.sqrt(diff / norm))


@pytest.mark.parametrize(
    "granularity,schedule,seed",
    [
        ("turn", "stream", 0),
        # a second seed of the same schedule: in make test, not test-quick
        pytest.param("turn", "stream", 1, marks=pytest.mark.slow),
        ("turn", "sync", 2),
        ("turn", "group", 4),
        ("turn", "async", 5),
        ("trajectory", "stream", 0),
        ("trajectory", "sync", 2),
    ],
)
def test_streamed_turns_equal_synchronous_full_trajectory_update(
    setup, learners, reference, granularity, schedule, seed
):
    _, params, trajs = setup
    ref, n_total = reference
    grads, metrics, stats = _run(learners[granularity], params, trajs, schedule, seed)
    assert metrics["tokens"] == n_total
    assert metrics["turns"] == sum(len(spans) for _, spans, _ in trajs.values())
    assert metrics["reward_mean"] == 0.5 and metrics["mixed_groups"] == 0
    assert "engine_logprob_gap_kl" not in metrics  # the turns carry no engine log-probs
    if schedule == "stream":
        assert stats.chunks > K  # the turns really were processed in pieces
    assert _rel_err(grads, ref) <= 1e-5
    assert float(sum(jnp.sum(g**2) for g in jax.tree.leaves(ref))) > 0


def test_open_trajectory_cap_and_uncounted_ends_give_the_same_update(setup, learner, reference):
    """At most 1 trajectory cache kept at a time (backpressure), and ends without a turn
    count (closed at the batch end) still give the synchronous update; the kept bytes are
    those of the open caches."""
    _, params, trajs = setup
    ref, _ = reference
    grads, metrics, stats = _run(learner, params, trajs, "stream", 6, max_open_members=1)
    assert stats.planner.open_members_peak == 1
    assert _rel_err(grads, ref) <= 1e-5
    grads, _, _ = _run(learner, params, trajs, "stream", 7, counted=False)
    assert _rel_err(grads, ref) <= 1e-5


def test_kept_bytes_count_the_open_caches(setup, learner):
    _, params, trajs = setup
    items = [it for it in _arrivals(trajs, 8) if it.group == 0 and it.member == 0]
    turns = sorted((it for it in items if isinstance(it.payload, TurnPayload)),
                   key=lambda it: it.payload.turn)  # fmt: skip
    batch = learner.process(learner.init(params, 0), turns[:1])
    (traj,) = batch.open.values()
    # k, v in float32 and dk, dv in float32: [L, 1, S, K, H] each
    assert traj.nbytes == 4 * 4 * CFG.num_hidden_layers * WIDTH * CFG.num_key_value_heads * 8
    assert learner.kept_bytes_peak(batch) == traj.nbytes
    end = next(it for it in items if isinstance(it.payload, MemberEnd))
    batch = learner.process(batch, [*turns[1:], end])
    assert not batch.open and learner.kept_bytes_peak(batch) == traj.nbytes


def _noisy_engine(graphdef, params, trajs, seed):
    """(the student's float64 log-probs [B, W], engine log-probs per member: the student's
    off by noise, as another engine's would be)."""
    tokens, _ = _padded(trajs)
    forward = jax.jit(lambda p, x: _logprobs(nnx.merge(graphdef, p), x))
    student_lp = np.asarray(forward(params, tokens), np.float64)
    rng = np.random.default_rng(seed)
    engine = {
        km: (student_lp[row] + rng.normal(0, 0.3, WIDTH)).astype(np.float32)
        for row, km in enumerate(trajs)
    }
    return student_lp, engine


@pytest.mark.parametrize("granularity", ["turn", "trajectory"])
def test_reverse_kl_is_the_mean_log_ratio_of_the_scored_tokens(setup, learners, granularity):
    """reverse_kl and the engine gap over the scored tokens, from the forward that gives
    log π_s: the segment direct pass (`turn`) or the one-shot score gradient (`trajectory`)."""
    graphdef, params, trajs = setup
    learner = learners[granularity]
    student_lp, engine = _noisy_engine(graphdef, params, trajs, 8)
    log_ratio, delta = [], []
    for row, (km, (_, spans, t_lp)) in enumerate(trajs.items()):
        log_ratio += [student_lp[row, t] - t_lp[t] for s, e in spans for t in range(s, e)]
        delta += [engine[km][t] - student_lp[row, t] for s, e in spans for t in range(s, e)]
    _, metrics, _ = _run(learner, params, trajs, "stream", 3, engine=engine)
    np.testing.assert_allclose(metrics["reverse_kl"], np.mean(log_ratio), rtol=1e-4)
    # The gap comes from the same forward, over the same scored tokens.
    d = np.asarray(delta)
    np.testing.assert_allclose(metrics["engine_logprob_gap_abs"], np.abs(d).mean(), rtol=1e-4)
    np.testing.assert_allclose(
        metrics["engine_logprob_gap_kl"], np.mean(np.expm1(-d) + d), rtol=1e-4
    )


def test_truncated_importance_weight_at_both_granularities(setup, reference):
    """rl.tis_cap: per-turn segments (the weight inside each direct pass, so in the buffered
    cotangents too) and the one-shot gradient both give the weighted synchronous update,
    which is not the unweighted one."""
    graphdef, params, trajs = setup
    _, engine = _noisy_engine(graphdef, params, trajs, 9)
    want, _ = _reference(graphdef, params, trajs, engine, tis_cap=1.2)
    assert _rel_err(want, reference[0]) > 1e-2
    for granularity, schedule in (("turn", "stream"), ("trajectory", "sync")):
        learner = _learner(graphdef, granularity, tis_cap=1.2)
        grads, _, _ = _run(learner, params, trajs, schedule, 4, engine=engine)
        assert _rel_err(grads, want) <= 1e-5, granularity


def test_turn_of_another_policy_version_is_refused(setup, learner):
    _, params, trajs = setup
    tokens, spans, t_lp = trajs[(0, 0)]
    s, e = spans[0]
    stale = TurnPayload.from_turn(tokens[:e], s, t_lp[s:e], 2, 0)
    item = WorkItem("g0m0t0", 0, 0.0, e - s, 0.0, stale, False, 0)
    with pytest.raises(StalePolicyError, match="version 2"):
        learner.process(learner.init(params, 3), [item])
    # async records the lag instead (one-step off-policy OPD)
    batch = learner.process(learner.init(params, 3, enforce_version=False), [item])
    assert learner.metrics(batch)["max_policy_lag"] == 1


def test_turn_payload_rejects_a_turn_outside_the_trajectory():
    with pytest.raises(ValueError, match="does not fit"):
        TurnPayload.from_turn(np.arange(5), 4, [0.1, 0.2, 0.3], 0, 0)


def test_opd_config_checks_name_the_bad_value():
    c = terminal_opd_cpu.get_config("smoke")
    c.rl.loss_agg = "seq-mean-token-mean"
    with pytest.raises(ConfigError, match="rl.loss_agg"):
        train.check(c)
    c = terminal_opd_cpu.get_config("smoke")
    with pytest.raises(ConfigError, match="experiments.terminal_opd"):
        train.check(c, entry_algorithm="grpo")  # an OPD config on the GRPO entry point
    c.env.family = "no_such_family"
    with pytest.raises(ConfigError, match="choose one of: mini_swe, swe_jsonl, .*terminal"):
        train.check(c)
    c = terminal_opd_cpu.get_config("smoke")
    c.rl.opd_granularity = "segment"
    with pytest.raises(ConfigError, match="rl.opd_granularity='segment'; valid: turn, trajec"):
        train.check(c)
    c.rl.opd_granularity = "auto"
    train.check(c)
    # auto's first step (nothing timed): one gradient per trajectory when nothing can overlap
    # the rollouts, else per turn (tests/algorithms/opd_auto_test.py: the later steps)
    assert _opd_auto.choose(None, schedules.get("sync")).granularity == "trajectory"
    assert _opd_auto.choose(None, schedules.get("stream")).granularity == "turn"
    for schedule in ("sync", "group", "stream", "async"):  # OPD runs every schedule
        c = terminal_opd_cpu.get_config("smoke")
        c.schedule = schedule
        c.lora.enabled = True
        c.lora.publish = "merged"
        c.rl.kl_coef = 0.1
        train.check(c)


def test_lora_turn_segments_equal_the_one_shot_trajectory_gradient(setup):
    """LoRA adapters over the frozen base (passed through the batch policy): per-turn
    segments give the adapters' gradient of the one-shot full-trajectory chunk."""
    graphdef, params, trajs = setup
    targets = ("q_proj", "v_proj", "up_proj")
    adapters = lora.init(params, 2, 4.0, targets, key=jax.random.key(1))
    # B = 0 at init would leave A without gradient: perturb every leaf
    adapters = jax.tree.map(lambda x: x + 0.05 * jnp.ones_like(x), adapters)
    grads = {}
    for granularity in ("turn", "trajectory"):
        score_fn = chunks.make_score_grad_fn(graphdef, seq_buckets=(WIDTH,), lora=True)
        seg_fns = segments.make_segment_fns(
            graphdef, CFG, seg_buckets=(8, WIDTH), cache_buckets=(WIDTH,), lora=True
        )
        learner = opd.batch_learner(
            accumulators.opd(), score_fn, 0, segment_fns=seg_fns, granularity=granularity
        )
        q: queue.Queue = queue.Queue()
        for it in _arrivals(trajs, 9):
            q.put(it)
        batch = learner.init(adapters, 0, params)
        batch, _ = run_learner_batch(Planner("stream", K, G, 9), q, batch, learner.process)
        grads[granularity] = learner.finalize(learner.close_groups(batch, set()))
    assert _rel_err(grads["turn"], grads["trajectory"]) <= 1e-5
    assert all(float(jnp.sum(g**2)) > 0 for g in jax.tree.leaves(grads["trajectory"]))


def test_a_lost_member_closes_its_trajectory_once_its_emitted_turns_are_in(
    setup, learner, reference
):
    """A member whose episode fails after its turns were scored: `MemberLost` (queued before
    the `MemberFailed`) closes and sweeps its trajectory; its turns still count."""
    _, params, trajs = setup
    ref, n_total = reference
    lost_key = (1, 1)
    q: queue.Queue = queue.Queue()
    for it in _arrivals(trajs, 10):
        if isinstance(it.payload, MemberEnd) and (it.group, it.member) == lost_key:
            turns = len(trajs[lost_key][1])
            q.put(WorkItem("g1m1lost", 1, 0.0, 0, it.arrival_s, MemberLost(turns), False, 1))
            q.put(MemberFailed(group=1, reason="episode: boom", member=1))
        else:
            q.put(it)
    batch = learner.init(params, 0)
    planner = Planner("stream", K, G, 9)
    batch, stats = run_learner_batch(planner, q, batch, learner.process, timeout_s=5)
    assert not batch.open and stats.failures == ["episode: boom"]
    grads = learner.finalize(learner.close_groups(batch, stats.failed_groups))
    assert learner.metrics(batch)["tokens"] == n_total
    assert _rel_err(grads, ref) <= 1e-5


def test_auto_explores_then_picks_the_predicted_granularity_with_the_same_update(setup, reference):
    """Four batches of `auto` under stream, each handed the previous one's carry: step 0
    runs the rule (turn), step 1 the other; later steps the predictor's argmin, or the
    granularity whose call kind only ran while compiling (its timings are dropped); every
    step gives the synchronous update, and the carry's trace is the batch's turns as the
    learner saw them (segment starts and lengths of the setup's trajectories)."""
    graphdef, params, trajs = setup
    ref, _ = reference
    score_fn = chunks.make_score_grad_fn(graphdef, (WIDTH,), pad_id=0)
    seg_fns = segments.make_segment_fns(
        graphdef, CFG, seg_buckets=(8, WIDTH), cache_buckets=(WIDTH,)
    )
    learner = opd.batch_learner(
        accumulators.opd(), score_fn, 0, segment_fns=seg_fns, granularity="auto",
        schedule=schedules.get("stream"),
    )  # fmt: skip
    carry, choices = None, []
    for step in range(4):
        q: queue.Queue = queue.Queue()
        for it in _arrivals(trajs, seed=20 + step):
            q.put(it)
        batch = learner.init(params, 0, carry=carry)
        planner = Planner("stream", K, G, 9)
        batch, _ = run_learner_batch(planner, q, batch, learner.process, timeout_s=5)
        batch = learner.close_groups(batch, set())
        assert _rel_err(learner.finalize(batch), ref) <= 1e-5
        m = learner.metrics(batch)
        assert m["opd_granularity_turn"] == float(batch.choice.granularity == "turn")
        if batch.choice.predicted is None:
            assert "opd_predicted_step_s_turn" not in m and batch.choice.reason.startswith(
                "explore"
            )
        else:
            predicted = {g: m[f"opd_predicted_step_s_{g}"] for g in ("turn", "trajectory")}
            assert batch.choice.granularity == min(predicted, key=predicted.get)
            assert min(predicted.values()) > 0
        choices.append(batch.choice)
        carry = learner.carry(batch)
    assert [c.granularity for c in choices[:2]] == ["turn", "trajectory"]
    assert choices[-1].predicted is not None  # every call kind has been timed by now
    assert carry.timed == {"turn", "trajectory"}
    traced = sim.trajectories(carry.trace)
    for tid, (_, spans, _) in enumerate(trajs.values()):  # traj ids: sorted (group, member)
        turns = traced[tid]
        assert [t.start + t.tokens for t in turns] == [e for _, e in spans]
        assert [t.scored for t in turns] == [e - s for s, e in spans]
    # every direct call of the turn step was timed under its padded shape
    direct_keys = {k for k in carry.calls if k[0] == "direct"}
    want = {
        k for turns in traced.values() for k in sim.segment_calls(turns, (8, WIDTH), (WIDTH,))[0]
    }
    assert direct_keys == want
