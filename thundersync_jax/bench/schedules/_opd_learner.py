"""The OPD benchmark's learner: one-shot trajectories or per-turn segments, timed per call.

Granularity `trajectory` is the training loop's own OPD batch learner
(`algorithms.opd.batch_learner`: student log-prob forward, Â, score gradient, accumulator)
on whole trajectories. Granularity `turn` runs each scored turn through `learner.segments`
over the trajectory's own cache (direct pass; the reverse sweep when its last turn comes)
and folds the gradients into the same `accumulators.opd()`: the update equals the one-shot
one. Every segment program call is timed on its own (`calls`): the predictor prices the
calls by their padded shape (`sim.SegmentCost`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from thundersync_jax import accumulators, sim
from thundersync_jax.algorithms import opd
from thundersync_jax.learner import buckets, chunks, segment_programs, segments
from thundersync_jax.learner.train_state import init_train_state, make_apply_update, make_optimizer
from thundersync_jax.models import qwen3

PAD_ID = 0


class TurnSegment(NamedTuple):
    """Payload of a `turn` work item: the segment's tokens and what scores them.

    Attributes:
      traj_id: the trajectory (its open segment state is kept under this id).
      tokens: int32 [n] the segment's tokens.
      loss_mask: float32 [n], 1 on the response tokens.
      teacher_logprobs: float32 [n] log π_T of the response tokens.
      last: the trajectory's last turn (its reverse sweep runs after the direct pass).
    """

    traj_id: int
    tokens: np.ndarray
    loss_mask: np.ndarray
    teacher_logprobs: np.ndarray
    last: bool


class TurnBatch(NamedTuple):
    """Per-batch state of the `turn` learner: the accumulator and the open trajectories."""

    acc: Any
    open: dict


def payload_fn(trace: Sequence[sim.OpdTurn], granularity: str, vocab_size: int, seed: int):
    """The `sim.opd_items` payload builder: random tokens and teacher log-probs per trajectory."""
    rng = np.random.default_rng(seed)
    tokens, teacher, masks = {}, {}, {}
    for tid, turns in sim.trajectories(trace).items():
        n = turns[-1].start + turns[-1].tokens
        tokens[tid] = rng.integers(1, vocab_size, size=n, dtype=np.int32)
        teacher[tid] = -rng.uniform(0.5, 4.0, size=n).astype(np.float32)
        masks[tid] = np.zeros(n, np.float32)
        for t in turns:
            masks[tid][t.start + t.tokens - t.scored : t.start + t.tokens] = 1.0

    def build(upto: list[sim.OpdTurn], t: sim.OpdTurn):
        tid, end = t.traj_id, t.start + t.tokens
        if granularity == "trajectory":
            m = masks[tid][:end] > 0
            return opd.TurnPayload(
                tokens[tid][:end], m, np.where(m, teacher[tid][:end], 0), 0, t.turn
            )
        seg = slice(t.start, end)
        return TurnSegment(tid, tokens[tid][seg], masks[tid][seg], teacher[tid][seg], t.last)

    return build


class BenchOpdLearner:
    """The OPD learner of the schedule benchmark; `use(granularity)` before `begin`.

    Args:
      model_cfg, optim_cfg: the config's `model` and `optim` sections.
      seq_buckets: one-shot sequence lengths; seg_buckets: segment lengths;
      cache_buckets: cache capacities (every trajectory's cache is opened at the largest).
    """

    def __init__(self, model_cfg, optim_cfg, seq_buckets, seg_buckets, cache_buckets, seed=0):
        cfg = qwen3.Qwen3Config.from_config_dict(model_cfg)
        model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed))
        self.vocab_size = cfg.vocab_size
        self.seq_buckets = buckets.validate_buckets(seq_buckets)
        graphdef, params = nnx.split(model, nnx.Param)
        self.acc = accumulators.opd(loss_agg="token-mean")
        score_fn = chunks.make_score_grad_fn(graphdef, self.seq_buckets, pad_id=PAD_ID)
        self.one_shot = opd.batch_learner(self.acc, score_fn, PAD_ID)
        self.fns = segments.make_segment_fns(
            graphdef, cfg, seg_buckets, cache_buckets, pad_id=PAD_ID
        )
        self.capacity = self.fns.cache_buckets[-1]
        self.calls: list[tuple[sim._opd.CallKey, float]] = []  # timed segment program calls
        programs = self.fns.programs
        programs.direct = self._timed("direct", programs.direct)
        programs.sweep = self._timed("sweep", programs.sweep)
        self._add = jax.jit(self.acc.add_weighted, donate_argnums=0)
        self.apply_update = make_apply_update(make_optimizer(optim_cfg), donate=False)
        self.state = init_train_state(params, make_optimizer(optim_cfg), seed)
        self.granularity = "trajectory"
        self.batch = None

    def _timed(self, kind: str, program):
        def call(*args, past_slots, **kwargs):
            seg = next(a for a in args if isinstance(a, segment_programs.SegmentInputs))
            start = time.perf_counter()
            out = jax.block_until_ready(program(*args, past_slots=past_slots, **kwargs))
            self.calls.append(
                ((kind, len(seg.inputs), int(past_slots)), time.perf_counter() - start)
            )
            return out

        return call

    def use(self, granularity: str) -> None:
        self.granularity = sim._opd.check_granularity(granularity)

    def begin(self, num_groups: int, group_size: int) -> None:
        """Starts a batch on the current parameters (OPD has no group coupling)."""
        del num_groups, group_size
        params = self.state.params
        if self.granularity == "trajectory":
            self.batch = self.one_shot.init(params, 0)
        else:
            self.batch = TurnBatch(self.acc.init(params), {})

    def process(self, batch, chunk):
        """One chunk's learner work, finished on return."""
        if self.granularity == "trajectory":
            self.batch = self.one_shot.process(batch, chunk)
            return self.batch
        params, acc, open_ = self.state.params, batch.acc, dict(batch.open)
        for it in chunk:
            q = it.payload
            traj = open_.pop(q.traj_id, None) or self.fns.open(self.capacity)
            traj, res = self.fns.score(
                params, traj, q.tokens, q.loss_mask, teacher_logprobs=q.teacher_logprobs
            )
            grad = res.grad
            if q.last:  # no more consumers: push the buffered K/V cotangents back
                deferred, _ = self.fns.close(params, traj)
                if deferred is not None:
                    grad = jax.tree.map(lambda a, b: a + b, grad, deferred)
            else:
                open_[q.traj_id] = traj
            acc = self._add(acc, grad, res.num_tokens, 1)
        jax.block_until_ready(acc)
        self.batch = TurnBatch(acc, open_)
        return self.batch

    def finish(self, advance: bool):
        """finalize + optimizer step; returns ∇L. `advance=False` keeps the parameters."""
        if self.granularity == "trajectory":
            grads = self.one_shot.finalize(self.batch)
        else:
            if self.batch.open:
                raise RuntimeError(f"trajectories {sorted(self.batch.open)} never closed")
            grads = self.acc.finalize(self.batch.acc)
        new_state, _, _ = self.apply_update(self.state, grads)
        jax.block_until_ready(new_state.params)
        if advance:
            self.state = new_state
        return grads


def opd_learner_from_config(config) -> BenchOpdLearner:
    """The OPD benchmark learner of a bench config (configs/bench_cpu.py:opd)."""
    return BenchOpdLearner(
        config.model,
        config.optim,
        tuple(config.seq_buckets),
        tuple(config.opd.seg_buckets),
        tuple(config.opd.cache_buckets),
    )
