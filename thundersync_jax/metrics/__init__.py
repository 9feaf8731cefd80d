"""Step metrics: metrics.jsonl writer, step timeline, plots, Chrome traces, progress bar.

Per-step metric names follow DESIGN §6. Timeline-derived ones:
  step_time_s        batch start → weights published
  rollout_time_s     batch start → last reward known
  learner_busy_s     time on chunks + optimizer step + publication
  learner_idle_frac  (step_time_s − learner_busy_s) / step_time_s
  tail_s             last reward → weights published
  open_groups_peak   most groups with some but not all members processed
The simulator (thundersync_jax.sim) predicts the same quantities from a trace.

This is the bottom layer: it imports nothing of sim, schedule, envs or rollout (a test
checks). The bridges to the simulator live in `thundersync_jax.sim.timelines`.
"""

from thundersync_jax.metrics._chrome import chrome_trace_events, write_chrome_trace
from thundersync_jax.metrics._plot import LEARNER_COLORS, plot_timeline
from thundersync_jax.metrics._progress import StepProgress
from thundersync_jax.metrics._timeline import (
    CHUNK,
    OPT,
    PUBLISH,
    ROLLOUT,
    Event,
    Timeline,
    learner_busy_s,
    learner_idle_frac,
    open_groups_peak,
    publish_s,
    rollout_time_s,
    step_metrics,
    step_time_s,
    tail_s,
)
from thundersync_jax.metrics._writer import METRICS_FILE, MetricsWriter, read_metrics

__all__ = [
    "CHUNK",
    "LEARNER_COLORS",
    "METRICS_FILE",
    "OPT",
    "PUBLISH",
    "ROLLOUT",
    "Event",
    "MetricsWriter",
    "StepProgress",
    "Timeline",
    "chrome_trace_events",
    "learner_busy_s",
    "learner_idle_frac",
    "open_groups_peak",
    "plot_timeline",
    "publish_s",
    "read_metrics",
    "rollout_time_s",
    "step_metrics",
    "step_time_s",
    "tail_s",
    "write_chrome_trace",
]
