"""When learner work may start: the scheduling policy of DESIGN §3, as plain data.

The planner sees finished trajectories (or scored turns) arrive and answers one
question whenever the learner is free: which chunk next? It holds no arrays and
does no JAX work, so the orchestrator, the benchmark and the tests share it.

Schedules:
  sync    nothing is ready until every trajectory of the batch is in.
  group   a group's trajectories are ready once the group is complete.
  stream  each trajectory is ready on arrival; the learner prefers
          (0) closed groups, (1) open groups whose rewards already differ (they
          cannot turn out zero-advantage), (2) the rest, oldest first.
  async   like sync, but fed with the previous step's rollouts (the trainer
          handles the pipelining; the planner sees a complete batch).

Chunks pack trajectories of one (group, reward) slot, oldest first, up to
`max_chunk_tokens` tokens. With `max_open_groups=M`, work of a group that has
no accumulator slot yet waits while M groups are open (backpressure): never an
out-of-memory crash, and never a deadlock, since open groups always complete.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

SCHEDULES = ("sync", "group", "stream", "async")


@dataclasses.dataclass
class WorkItem:
    """One unit of learner input: a finished trajectory (GRPO) or a scored turn (OPD).

    Attributes:
      item_id: unique id within the step (e.g. "g3m1" or "g3m1t2").
      group: prompt group index in [0, num_groups).
      reward: the trajectory's reward (GRPO); 0.0 for OPD turns.
      num_tokens: loss-masked tokens, the cost driver of the chunk.
      arrival_s: when its inputs were fixed (reward known / turn scored).
      payload: whatever the learner needs to build the chunk (tokens, masks).
      closes_member: True when this item completes a group member (always True
        for GRPO; for OPD only a trajectory's last turn).
      member: member index in its group (orders ties deterministically).
    """

    item_id: str
    group: int
    reward: float
    num_tokens: int
    arrival_s: float
    payload: Any = None
    closes_member: bool = True
    member: int = 0


class Planner:
    """Decides the next learner chunk for one batch (one optimizer step)."""

    def __init__(
        self,
        schedule: str,
        num_groups: int,
        group_size: int,
        max_chunk_tokens: int,
        max_open_groups: int | None = None,
    ):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r}; valid: {', '.join(SCHEDULES)}")
        if num_groups < 1 or group_size < 1:
            raise ValueError(f"num_groups={num_groups}, group_size={group_size}: both must be >= 1")
        if max_chunk_tokens < 1:
            raise ValueError(f"max_chunk_tokens={max_chunk_tokens} must be >= 1")
        if max_open_groups is not None and max_open_groups < 1:
            raise ValueError(f"max_open_groups={max_open_groups} must be >= 1 or None")
        self.schedule = schedule
        self.num_groups = num_groups
        self.group_size = group_size
        self.max_chunk_tokens = max_chunk_tokens
        self.max_open_groups = max_open_groups
        self._pending: list[WorkItem] = []  # arrived, not yet handed out
        self._members_in = [0] * num_groups  # finished members per group
        self._rewards_seen: list[set[float]] = [set() for _ in range(num_groups)]
        self._members_taken = [0] * num_groups  # members handed to the learner
        self._expected = [group_size] * num_groups
        self._completed_at = [float("inf")] * num_groups
        self.open_groups_peak = 0

    # -- arrivals ---------------------------------------------------------
    def push(self, item: WorkItem) -> None:
        """Records an arrived item."""
        if not 0 <= item.group < self.num_groups:
            raise ValueError(
                f"item {item.item_id}: group={item.group} not in [0, {self.num_groups})"
            )
        if item.closes_member:
            if self._members_in[item.group] >= self._expected[item.group]:
                raise ValueError(
                    f"item {item.item_id}: group {item.group} already has "
                    f"{self._expected[item.group]} members"
                )
            self._members_in[item.group] += 1
            self._rewards_seen[item.group].add(float(item.reward))
            if self.group_complete(item.group):
                self._completed_at[item.group] = item.arrival_s
        self._pending.append(item)

    def drop_member(self, group: int) -> None:
        """A member will never arrive (its rollout failed for good): shrink the group."""
        if self._expected[group] <= self._members_in[group]:
            raise ValueError(f"group {group}: no outstanding member to drop")
        self._expected[group] -= 1
        if self.group_complete(group):
            self._completed_at[group] = max(
                (it.arrival_s for it in self._pending if it.group == group), default=0.0
            )

    # -- state ------------------------------------------------------------
    def group_complete(self, group: int) -> bool:
        return self._members_in[group] >= self._expected[group]

    def batch_complete(self) -> bool:
        return all(self.group_complete(k) for k in range(self.num_groups))

    def done(self) -> bool:
        """Every item arrived and was handed out."""
        return self.batch_complete() and not self._pending

    def open_groups(self) -> set[int]:
        """Groups with some members handed out whose group is not yet complete-and-drained."""
        return {
            k
            for k in range(self.num_groups)
            if self._members_taken[k] > 0 and self._members_taken[k] < self._expected[k]
        }

    # -- decisions --------------------------------------------------------
    def _ready(self) -> list[WorkItem]:
        if self.schedule in ("sync", "async"):
            return list(self._pending) if self.batch_complete() else []
        if self.schedule == "group":
            return [it for it in self._pending if self.group_complete(it.group)]
        return list(self._pending)

    def _priority(self, item: WorkItem) -> tuple:
        k = item.group
        if self.schedule in ("sync", "async"):
            # The whole batch is in: a fixed order makes the synchronous update bitwise
            # reproducible (resume after a crash lands on exactly the same parameters).
            return (0, float(k), item.member, item.item_id)
        if self.schedule == "group":
            # FIFO by readiness: groups in the order they completed.
            # Groups completing at the same instant are taken one whole group at a time.
            return (0, self._completed_at[k], float(k), item.member, item.item_id)
        if self.group_complete(k):
            rank = 0
        elif len(self._rewards_seen[k]) > 1:
            rank = 1
        else:
            rank = 2
        return (rank, item.arrival_s, item.member, item.item_id)

    def next_chunk(self) -> list[WorkItem]:
        """The next chunk to run (items of one (group, reward) slot), or [] if none is ready."""
        ready = self._ready()
        if not ready:
            return []
        open_now = self.open_groups()
        if self.max_open_groups is not None and len(open_now) >= self.max_open_groups:
            ready = [it for it in ready if it.group in open_now]
            if not ready:
                return []  # backpressure: wait for an open group to complete
        ready.sort(key=self._priority)
        head = ready[0]
        chunk, tokens = [], 0
        for it in ready:
            if it.group != head.group or it.reward != head.reward:
                continue
            if chunk and tokens + it.num_tokens > self.max_chunk_tokens:
                break
            chunk.append(it)
            tokens += it.num_tokens
        taken = {id(it) for it in chunk}
        self._pending = [it for it in self._pending if id(it) not in taken]
        self._members_taken[head.group] += sum(it.closes_member for it in chunk)
        self.open_groups_peak = max(self.open_groups_peak, len(self.open_groups()))
        return chunk

    def drain(self) -> Iterable[list[WorkItem]]:
        """All chunks ready right now, in order (for tests and the simulator)."""
        while chunk := self.next_chunk():
            yield chunk
