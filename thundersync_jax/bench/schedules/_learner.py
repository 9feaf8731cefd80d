"""The benchmark's learner: the training run's real learner pieces, timed.

A tiny Qwen3 policy, `learner.chunks` score-gradient chunks, the streaming GRPO
accumulator through the training loop's own `algorithms.grpo` batch learner, and a
real optax step from `learner.train_state`. Chunks block until their result is on hand, so a chunk's
measured time is its compute, and the planner's next decision sees every
arrival up to then (what the simulator assumes).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx

from thundersync_jax import accumulators
from thundersync_jax.algorithms import grpo
from thundersync_jax.bench.schedules._gc import collector_paused
from thundersync_jax.bench.schedules._workload import ReplayTrajectory
from thundersync_jax.learner import buckets, chunks
from thundersync_jax.learner.train_state import init_train_state, make_apply_update, make_optimizer
from thundersync_jax.models import qwen3
from thundersync_jax.schedule.planner import WorkItem
from thundersync_jax.sim import CostModel

PAD_ID = 0


STALL_FACTOR = 4.0  # a sample above this many medians is a stall, not the shape's cost


def stall_free_mean(samples: Sequence[float]) -> float:
    """Mean of the samples at most STALL_FACTOR × their median.

    The step time is a sum of chunk times, so the mean is what predicts it: a
    trimmed statistic (median, interquartile mean) drops the slow side of a
    right-skewed distribution and under-prices every chunk, which shows most in
    `sync`, where no idle time absorbs a slow chunk (measured: +10% error with the
    interquartile mean). Only gross stalls (a rare pause of tens of milliseconds on a
    few-millisecond chunk) are left out: one of them would move a 20-sample mean by
    more than the whole effect being measured.
    """
    if not samples:
        raise ValueError("no timing samples")
    cut = STALL_FACTOR * statistics.median(samples)
    return statistics.fmean(x for x in samples if x <= cut)


class BenchLearner:
    """Score-gradient chunks, accumulator and optimizer step of one policy, with timers.

    Args:
      model_cfg: the `model` section of a config (configs/common.py tiny_qwen3_model).
      optim_cfg: the `optim` section.
      seq_buckets: padded sequence lengths of the score-gradient function.
      seed: parameter-init seed.
      deterministic: the accumulator's exact tallies (`rl.deterministic`, DESIGN §8).
    """

    def __init__(
        self,
        model_cfg,
        optim_cfg,
        seq_buckets: Sequence[int],
        seed: int = 0,
        deterministic: bool = False,
    ):
        self.deterministic = bool(deterministic)
        cfg = qwen3.Qwen3Config.from_config_dict(model_cfg)
        model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed))
        self.vocab_size = cfg.vocab_size
        self.seq_buckets = buckets.validate_buckets(seq_buckets)
        graphdef, params = nnx.split(model, nnx.Param)
        self.score_fn = chunks.make_score_grad_fn(graphdef, self.seq_buckets, pad_id=PAD_ID)
        optimizer = make_optimizer(optim_cfg)
        self.apply_update = make_apply_update(optimizer, donate=False)  # advance=False keeps it
        self.state = init_train_state(params, optimizer, seed)
        self.grpo = None  # the GRPO BatchLearner of the current batch shape
        self.batch = None  # its per-batch state
        self._batch_shape: tuple[int, int] | None = None

    def begin(self, num_groups: int, group_size: int) -> None:
        """Starts a batch of `num_groups` × `group_size` on the current parameters."""
        if self._batch_shape != (num_groups, group_size):
            # A new accumulator (and its jitted add) only when the batch shape changes.
            acc = accumulators.grpo(
                num_groups=num_groups, group_size=group_size, deterministic=self.deterministic
            )
            self.grpo = grpo.batch_learner(acc, self.score_fn, PAD_ID)
            self._batch_shape = (num_groups, group_size)
        self.batch = self.grpo.init(self.state.params, 0)

    def process(self, batch, chunk: list[WorkItem]):
        """One chunk's score gradient folded into the accumulator, finished on return."""
        batch = self.grpo.process(batch, chunk)
        jax.block_until_ready(batch.acc)
        self.batch = batch
        return batch

    def finish(self, advance: bool):
        """finalize + optimizer step; returns ∇L. `advance=False` keeps the parameters."""
        grads = self.grpo.finalize(self.batch)
        new_state, _, _ = self.apply_update(self.state, grads)
        jax.block_until_ready(new_state.params)
        if advance:
            self.state = new_state
        return grads

    # -- compile warm-up and calibration ------------------------------------------
    def shapes(self, max_rows: int) -> list[tuple[int, int]]:
        """Every padded (rows, length) a chunk of at most `max_rows` trajectories can take."""
        rows = sorted({buckets.bucket_rows(r) for r in range(1, max_rows + 1)})
        return [(r, b) for r in rows for b in self.seq_buckets]

    def _probe_chunk(self, rows: int, length: int, rng: np.random.Generator) -> list[WorkItem]:
        mask = np.ones(length, np.float32)
        mask[0] = 0.0
        return [
            WorkItem(
                item_id=f"probe{m}",
                group=0,
                reward=1.0,
                num_tokens=length,
                arrival_s=0.0,
                payload=ReplayTrajectory(
                    rng.integers(1, self.vocab_size, size=length, dtype=np.int32), mask, (0,)
                ),
                member=m,
            )
            for m in range(rows)
        ]

    def padded_shape(self, rows: int, longest: int) -> tuple[int, int]:
        """(rows, length) of the block the score-gradient call runs for such a chunk."""
        return buckets.bucket_rows(rows), buckets.bucket_length(longest, self.seq_buckets)

    def _timed(self, chunk: Sequence[WorkItem]) -> float:
        start = time.perf_counter()
        self.process(self.batch, list(chunk))
        return time.perf_counter() - start

    def time_shapes(
        self, num_groups: int, group_size: int, max_rows: int, reps: int, seed: int = 0
    ) -> CalibrationSamples:
        """Compiles and times every chunk shape of a K × G batch, and the optimizer step.

        A chunk holds at most `max_rows` trajectories (≤ G: one slot of one group).
        Every padded (rows, bucket) shape runs once untimed (compiling) and `reps`
        times timed, on the accumulator the batch uses; finalize + the optimizer
        step run `reps` + 1 times (the first compiles and is not kept). The cyclic
        garbage collector is off throughout (`collector_paused`), as in every replay.
        """
        with collector_paused():
            rng = np.random.default_rng(seed)
            out = CalibrationSamples()
            self.begin(num_groups, group_size)
            for rows, length in self.shapes(max_rows):
                chunk = self._probe_chunk(min(rows, max_rows), length, rng)
                self.process(self.batch, chunk)  # compiles
                for _ in range(reps):
                    self.begin(num_groups, group_size)
                    out.add_chunk(rows, length, self._timed(chunk))
            fill = [self._probe_chunk(1, self.seq_buckets[0], rng)[0] for _ in range(group_size)]
            for m, it in enumerate(fill):
                it.member = m
            for rep in range(reps + 1):
                self.begin(num_groups, group_size)
                for it in fill:  # finalize wants no half-filled group: fill group 0, row by row
                    self.process(self.batch, [it])
                start = time.perf_counter()
                self.finish(advance=False)
                if rep:  # the first call compiles
                    out.opt.append(time.perf_counter() - start)
            return out


@dataclasses.dataclass
class CalibrationSamples:
    """Timed chunks per padded (rows, length) shape, and timed optimizer steps (seconds)."""

    chunks: dict[tuple[int, int], list[float]] = dataclasses.field(default_factory=dict)
    opt: list[float] = dataclasses.field(default_factory=list)

    def add_chunk(self, rows: int, length: int, seconds: float) -> None:
        self.chunks.setdefault((int(rows), int(length)), []).append(float(seconds))

    def extend(self, other: CalibrationSamples) -> None:
        """Pools `other`'s samples into these."""
        for shape, ts in other.chunks.items():
            self.chunks.setdefault(shape, []).extend(ts)
        self.opt.extend(other.opt)


def fit_cost(
    samples: CalibrationSamples, seq_buckets: Sequence[int]
) -> tuple[CostModel, list[dict]]:
    """Prices every timed shape by its samples' mean without gross stalls; fits the line too.

    The step time is a sum of chunk times, so a mean predicts it, but one stall
    must not set the cost of a whole shape (`stall_free_mean`). opt_s is the
    median optimizer step. The returned model prices each timed shape by its mean
    (`CostModel.shape_s`); the fixed + per-token line through those means is the
    fallback (and `cost.affine()`, reported alongside).

    Returns the model and one row per padded shape: rows, length, samples, seconds.
    """
    if not samples.opt:
        raise ValueError("no timed optimizer step among the calibration samples")
    table = [
        {"rows": r, "length": n, "samples": len(ts), "seconds": stall_free_mean(ts)}
        for (r, n), ts in sorted(samples.chunks.items())
    ]
    cost = CostModel.fit(
        [(row["rows"] * row["length"], row["seconds"]) for row in table],
        opt_s=statistics.median(samples.opt),
        buckets=tuple(seq_buckets),
        row_padding=True,
    )
    shapes = tuple((row["rows"], row["length"], row["seconds"]) for row in table)
    return dataclasses.replace(cost, shape_s=shapes), table


def learner_from_config(config: ml_collections.ConfigDict):
    """The benchmark learner of a bench config (configs/bench_cpu.py): GRPO's or OPD's."""
    deterministic = bool(config.deterministic)
    if config.algorithm == "opd":
        if deterministic:
            # accumulators.opd has no exact tallies (rl.deterministic is GRPO's, DESIGN §8).
            raise ValueError(
                "bench config deterministic=True needs algorithm='grpo' "
                "(the OPD accumulator has no exact tallies); got algorithm='opd'"
            )
        from thundersync_jax.bench.schedules._opd_learner import opd_learner_from_config

        return opd_learner_from_config(config)
    return BenchLearner(
        config.model, config.optim, tuple(config.seq_buckets), seed=0, deterministic=deterministic
    )
