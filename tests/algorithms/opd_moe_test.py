"""OPD on a Qwen3-MoE student with routing replay: the streamed `trajectory`-granularity update
equals the batch-synchronous one taken through the engine's routes.

Each turn's payload carries the routes of its request's fed tokens (the prefix up to its last
sampled token); the learner replays the latest turn's, for the student log-probs of Â and the
gradient alike. The reference: one forward per trajectory with those routes replayed, every turn
masked in, −(1/N) Σ Â ∇ log π_s with Â = stop_gradient(log π_T − log π_s), by jax.grad.
"""

import os
import queue
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import cpu, terminal_opd_cpu
from thundersync_jax import accumulators, algorithms
from thundersync_jax.algorithms import opd
from thundersync_jax.algorithms.base import MemberEnd
from thundersync_jax.algorithms.opd import TurnPayload
from thundersync_jax.learner import chunks
from thundersync_jax.schedule import schedules
from thundersync_jax.schedule.config_check import ConfigError
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.planner import Planner, WorkItem

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
)
from moe_models import QWEN, random_model  # noqa: E402  (tiny random MoE models)

K, G, WIDTH = 2, 2, 32
M, TOP_K = sum(QWEN.sparse_layers), QWEN.moe.top_k


def _replayed_logprobs(model, tokens, routes):
    """[B, W] log π(tokens[:, t] | tokens[:, <t]) with `routes` replayed, 0 at t = 0."""
    hidden, _ = model.hidden_states(tokens[:, :-1], routes=routes[:, :-1])
    logp, _ = model.token_terms(hidden, tokens[:, 1:], 1.0)
    return jnp.pad(logp, ((0, 0), (1, 0)))


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(3)
    graphdef, params = nnx.split(random_model(QWEN, seed=0), nnx.Param)
    layout = {}
    for k in range(K):
        for m in range(G):
            pos, spans = int(rng.integers(3, 6)), []
            for _ in range(int(rng.integers(1, 4))):
                length = int(rng.integers(2, 8))
                spans.append((pos, pos + length))
                pos += length + int(rng.integers(1, 4))  # tool results between turns
            layout[(k, m)] = (rng.integers(1, QWEN.vocab_size, size=pos).astype(np.int32), spans)
    padded = np.zeros((len(layout), WIDTH), np.int32)
    for row, (tokens, _) in enumerate(layout.values()):
        padded[row, : len(tokens)] = tokens
    t_graphdef, t_params = nnx.split(random_model(QWEN, seed=1), nnx.Param)
    no_routes = np.full((len(layout), WIDTH, M, TOP_K), -1, np.int32)  # the teacher's own
    teacher_lp = jax.jit(lambda p: _replayed_logprobs(nnx.merge(t_graphdef, p), padded, no_routes))
    teacher_lp = np.asarray(teacher_lp(t_params))
    trajs = {}
    for row, (km, (tokens, spans)) in enumerate(layout.items()):
        # The engine's routes: K distinct experts per token and layer, mostly not the
        # learner's own choice (a stand-in for an engine whose router numerics differ).
        routes = np.argsort(rng.random((len(tokens), M, QWEN.num_experts)), -1)[..., :TOP_K]
        trajs[km] = (tokens, spans, teacher_lp[row, : len(tokens)], routes.astype(np.int32))
    return graphdef, params, trajs


def _reference(graphdef, params, trajs, replay):
    tokens = np.zeros((len(trajs), WIDTH), np.int32)
    mask = np.zeros((len(trajs), WIDTH), np.float32)
    teacher_lp = np.zeros((len(trajs), WIDTH), np.float32)
    routes = np.full((len(trajs), WIDTH, M, TOP_K), -1, np.int32)
    for row, (toks, spans, t_lp, r) in enumerate(trajs.values()):
        tokens[row, : len(toks)], teacher_lp[row, : len(toks)] = toks, t_lp
        for s, e in spans:
            mask[row, s:e] = 1
        last_fed = spans[-1][1] - 1  # the last turn's request fed every token before its last
        if replay:
            routes[row, :last_fed] = r[:last_fed]
    n_total = int(mask.sum())

    def objective(p):
        lp = _replayed_logprobs(nnx.merge(graphdef, p), tokens, routes)
        advantage = jax.lax.stop_gradient(teacher_lp - lp)
        return -jnp.sum(advantage * mask * lp) / n_total

    return jax.jit(jax.grad(objective))(params), n_total


def _run(graphdef, params, trajs, schedule, seed):
    score_fn = chunks.make_score_grad_fn(graphdef, (WIDTH,), pad_id=0, routing="replay")
    learner = opd.batch_learner(accumulators.opd(), score_fn, 0, granularity="trajectory")
    rng = np.random.default_rng(seed)
    per_member = []
    for (k, m), (tokens, spans, t_lp, routes) in trajs.items():
        items = []
        for j in rng.permutation(len(spans)):  # the teacher may finish turns out of order
            s, e = spans[j]
            # the turn's request fed tokens [0, e - 1): the engine reported their routes
            payload = TurnPayload.from_turn(
                tokens[:e], s, t_lp[s:e], 0, int(j), None, routes[: e - 1]
            )
            items.append(WorkItem(f"g{k}m{m}t{j}", k, 0.0, e - s, 0.0, payload, False, m))
        end = MemberEnd(float(k), None, len(spans))
        items.append(WorkItem(f"g{k}m{m}end", k, 0.0, 0, 0.0, end, True, m))
        per_member.append(items)
    q: queue.Queue = queue.Queue()
    t = 0
    while any(per_member):
        live = [i for i, items in enumerate(per_member) if items]
        item = per_member[int(rng.choice(live))].pop(0)
        item.arrival_s, t = float(t), t + 1
        q.put(item)
    batch = learner.init(params, 0)
    batch, _ = run_learner_batch(Planner(schedule, K, G, 9), q, batch, learner.process, timeout_s=5)
    batch = learner.close_groups(batch, set())
    return learner.finalize(batch), learner.metrics(batch)


def _rel_err(a, b) -> float:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    diff = sum(float(jnp.sum((x - y) ** 2)) for x, y in pairs)
    return float(np.sqrt(diff / sum(float(jnp.sum(y**2)) for y in jax.tree.leaves(b))))


@pytest.mark.parametrize(
    "schedule,seed",
    # stream: in make test, not test-quick (one of the unit tier's slowest compiles)
    [
        pytest.param("stream", 0, marks=pytest.mark.slow),
        pytest.param("sync", 1, marks=pytest.mark.nightly),
    ],
)
def test_streamed_replayed_opd_equals_the_synchronous_replayed_update(setup, schedule, seed):
    graphdef, params, trajs = setup
    ref, n_total = _reference(graphdef, params, trajs, replay=True)
    grads, metrics = _run(graphdef, params, trajs, schedules.get(schedule), seed)
    assert metrics["tokens"] == n_total
    assert _rel_err(grads, ref) <= 1e-5
    # the routes really were replayed: recomputing them gives another update, and the
    # learner's own router disagrees with most of the engine's (random) top-k sets
    recomputed, _ = _reference(graphdef, params, trajs, replay=False)
    assert _rel_err(recomputed, ref) > 1e-2
    assert metrics["routing_disagreement"] > 0.5


def test_moe_needs_trajectory_granularity():
    c = terminal_opd_cpu.get_config()
    c.model.update(cpu.TINY_MOE["moe"])
    algo = algorithms.get("opd")
    for granularity in ("turn", "auto"):
        c.rl.opd_granularity = granularity
        with pytest.raises(ConfigError, match="rl.opd_granularity='trajectory'"):
            algo.check_config(c)
    c.rl.opd_granularity = "trajectory"
    algo.check_config(c)
    c.rl.opd_granularity, c.model.routing = "turn", "recompute"  # no MoE segments either way
    with pytest.raises(ConfigError, match="segments run the dense decoder only"):
        algo.check_config(c)
