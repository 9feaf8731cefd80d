"""The four schedules as one object each: every rule that differs between them lives here.

    from thundersync_jax.schedule import schedules
    s = schedules.get("stream")
    s.item_ready(group_complete=False, batch_complete=False)   # True: ready on arrival
    s.enforces_version, s.pipelined, s.policy_lag              # False, False, 0

The planner (when work is ready, in which order), the training loop (version
checks, pipelining the next batch's rollouts), the simulator (chunk kinds, the
barrier of `async`), the memory planner (open-group tallies on the device) and
the config check (valid names) all ask a `Schedule`; no other module compares
schedule names. This module imports nothing else of the project, so every layer
(the trace-driven simulator included) may import it.

  sync    nothing is ready until every trajectory of the batch is in; the batch
          runs in (group, member) order.
  group   a group's trajectories are ready once the group is complete; groups
          run in the order they completed.
  stream  each trajectory (OPD: each scored turn) is ready on arrival; the
          learner prefers (0) closed groups, (1) open groups whose rewards already
          differ (they cannot turn out zero-advantage), (2) the rest, oldest first.
  async   one-step off-policy staleness baseline: the rollouts of step n+1 run on
          policy n while the learner trains step n on rollouts of policy n-1. The
          batch is processed like sync (it is complete when the learner starts),
          versions are not enforced (lag 1 is recorded), and the next batch's
          episodes all finish before policy n+1 is published, so no trajectory
          mixes two versions.
"""

from __future__ import annotations

import dataclasses

# What a stream chunk's group looked like when it was picked (also the sim's chunk kinds).
STREAM_RANKS = ("closed", "differing", "open")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When learner work may start, and what that implies.

    Attributes:
      name: "sync" | "group" | "stream" | "async".
      ready_when: "batch" (every trajectory of the batch is in), "group" (the item's
        group is complete) or "arrival" (at once).
      pipelined: the next batch's rollouts run while this batch trains (async).
      description: one line for help texts and errors.
    """

    name: str
    ready_when: str
    pipelined: bool
    description: str

    @property
    def enforces_version(self) -> bool:
        """Whether every item must be sampled by the learner's own policy version (lag 0)."""
        return not self.pipelined

    @property
    def policy_lag(self) -> int:
        """Versions between the sampling policy and the learner's, in the steady state."""
        return 1 if self.pipelined else 0

    @property
    def overlaps_rollouts(self) -> bool:
        """Whether learner work of a batch can run while that batch's rollouts still arrive."""
        return self.ready_when != "batch"

    def item_ready(self, *, group_complete: bool, batch_complete: bool) -> bool:
        """Whether an arrived item may be handed to the learner now."""
        if self.ready_when == "batch":
            return batch_complete
        if self.ready_when == "group":
            return group_complete
        return True

    def rank(self, *, group_complete: bool, rewards_differ: bool) -> int:
        """The stream priority class of an item's group (index into STREAM_RANKS)."""
        if group_complete:
            return 0
        return 1 if rewards_differ else 2

    def priority(
        self,
        *,
        group: int,
        member: int,
        item_id: str,
        arrival_s: float,
        completed_at: float,
        group_complete: bool,
        rewards_differ: bool,
    ) -> tuple:
        """Sort key of a ready item: smaller runs first."""
        if self.ready_when == "batch":
            # The whole batch is in: a fixed order makes the synchronous update bitwise
            # reproducible (resume after a crash lands on exactly the same parameters).
            return (0, float(group), member, item_id)
        if self.ready_when == "group":
            # FIFO by readiness; groups completing at the same instant go one whole group
            # at a time.
            return (0, completed_at, float(group), member, item_id)
        r = self.rank(group_complete=group_complete, rewards_differ=rewards_differ)
        return (r, arrival_s, member, item_id)

    def chunk_kind(self, *, group_complete: bool, rewards_differ: bool) -> str:
        """Why a chunk ran (the simulator's and timelines' label)."""
        if self.ready_when == "batch":
            return "batch"
        if self.ready_when == "group":
            return "group"
        return STREAM_RANKS[self.rank(group_complete=group_complete, rewards_differ=rewards_differ)]

    def open_group_tallies(self, num_groups: int, max_open_groups: int | None) -> int:
        """Groups that can hold a partial tally at once (beyond the one being filled).

        Only a schedule that starts a group before it is complete keeps groups open;
        `max_open_groups` caps them (backpressure).
        """
        if self.ready_when != "arrival":
            return 0
        return int(max_open_groups or num_groups)


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule("sync", "batch", False, "learner starts after the whole batch is in"),
        Schedule("group", "group", False, "learner starts a group once it is complete"),
        Schedule("stream", "arrival", False, "learner starts each trajectory/turn on arrival"),
        Schedule("async", "batch", True, "one-step off-policy baseline (policy lag 1)"),
    )
}
NAMES = tuple(SCHEDULES)


def get(schedule: str | Schedule) -> Schedule:
    """The `Schedule` named `schedule` (a `Schedule` passes through); clear error otherwise."""
    if isinstance(schedule, Schedule):
        return schedule
    try:
        return SCHEDULES[schedule]
    except (KeyError, TypeError):
        raise ValueError(
            f"schedule={schedule!r} is not valid; choose one of: {', '.join(NAMES)}"
        ) from None
