"""The OPD benchmark's learner: the training loop's OPD batch learner, segment calls timed.

`algorithms.opd.batch_learner` at `rl.opd_granularity` `turn` (each scored turn a segment
over the trajectory's own learner cache, the reverse sweep when the member closes) or
`trajectory` (turns kept on the host, one one-shot gradient at close), over the same
`accumulators.opd()`: both give the one-shot update. Every segment program call is timed on
its own (`calls`): the predictor prices calls by their padded shape (`sim.SegmentCost`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from thundersync_jax import accumulators, sim
from thundersync_jax.algorithms import opd
from thundersync_jax.algorithms.base import MemberEnd
from thundersync_jax.learner import buckets, chunks, segment_programs, segments
from thundersync_jax.learner.train_state import init_train_state, make_apply_update, make_optimizer
from thundersync_jax.models import qwen3

PAD_ID = 0


def payload_fn(trace: Sequence[sim.OpdTurn], vocab_size: int, seed: int):
    """The `sim.opd_items` payload builder: a turn's `TurnPayload`, or the closing `MemberEnd`.

    Token ids and teacher log-probs are random (learner cost does not depend on them).
    """
    rng = np.random.default_rng(seed)
    tokens, teacher, counts = {}, {}, {}
    for tid, turns in sim.trajectories(trace).items():
        n = turns[-1].start + turns[-1].tokens
        tokens[tid] = rng.integers(1, vocab_size, size=n, dtype=np.int32)
        teacher[tid] = -rng.uniform(0.5, 4.0, size=n).astype(np.float32)
        counts[tid] = len(turns)

    def build(t: sim.OpdTurn, end: bool):
        if end:
            return MemberEnd(0.0, None, turns=counts[t.traj_id])
        first = t.start + t.tokens - t.scored  # the response: the segment's last tokens
        return opd.TurnPayload.from_turn(
            tokens[t.traj_id], first, teacher[t.traj_id][first : first + t.scored], 0, t.turn
        )

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
        acc = accumulators.opd(loss_agg="token-mean")
        score_fn = chunks.make_score_grad_fn(graphdef, self.seq_buckets, pad_id=PAD_ID)
        self.fns = segments.make_segment_fns(
            graphdef, cfg, seg_buckets, cache_buckets, pad_id=PAD_ID
        )
        self.calls: list[tuple[sim.CallKey, float]] = []  # timed segment program calls
        programs = self.fns.programs
        programs.direct = self._timed("direct", programs.direct)
        programs.sweep = self._timed("sweep", programs.sweep)
        self.learners = {
            g: opd.batch_learner(acc, score_fn, PAD_ID, segment_fns=self.fns, granularity=g)
            for g in sim.GRANULARITIES
        }
        optimizer = make_optimizer(optim_cfg)
        self.apply_update = make_apply_update(optimizer, donate=False)
        self.state = init_train_state(params, optimizer, seed)
        self.granularity = "trajectory"
        self.batch = None

    def _timed(self, kind: str, program):
        def call(*args, past_slots, **kwargs):
            seg = next(a for a in args if isinstance(a, segment_programs.SegmentInputs))
            cap = int(args[2][0].shape[2])  # the caches (k, v, dk, dv): [L, 1, S, K, H]
            start = time.perf_counter()
            out = jax.block_until_ready(program(*args, past_slots=past_slots, **kwargs))
            key = (kind, len(seg.inputs), int(past_slots), cap)
            self.calls.append((key, time.perf_counter() - start))
            return out

        return call

    def use(self, granularity: str) -> None:
        self.granularity = sim._opd.check_granularity(granularity)

    def begin(self, num_groups: int, group_size: int) -> None:
        """Starts a batch on the current parameters (OPD has no group coupling)."""
        del num_groups, group_size
        self.batch = self.learners[self.granularity].init(self.state.params, 0)

    def process(self, batch, chunk):
        """One chunk's learner work (the loop's OPD `process`), finished on return."""
        self.batch = self.learners[self.granularity].process(batch, chunk)
        return self.batch

    def finish(self, advance: bool):
        """finalize + optimizer step; returns ∇L. `advance=False` keeps the parameters."""
        grads = self.learners[self.granularity].finalize(self.batch)
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
