"""Which learner chunk runs next: the bookkeeping of one batch under a `Schedule`.

The planner sees finished trajectories (or scored turns) arrive and answers one
question whenever the learner is free: which chunk next? It holds no arrays and
does no JAX work, so the training loop, the benchmark, the simulator and the tests
share it. What is ready and in which order is the `Schedule`'s rule
(`schedule/schedules.py`); the planner tracks groups, members and rewards.

Chunks pack items of one (group, reward) slot, in priority order, up to
`max_chunk_tokens` tokens (and at most `max_chunk_items` items: 1 under
`rl.deterministic`, so a call's composition is fixed by the data, never by
timing). With `max_open_groups=M`, work of a group that has no accumulator slot
yet waits while M groups are open (backpressure): never an out-of-memory crash,
and never a deadlock, since open groups always complete. `max_open_members=T`
does the same for members whose work comes in several items (OPD turns, each
open trajectory holding a learner KV cache): a member is open from its first
handed-out item until its closing item and all its other items are handed out
(or it was dropped); items of a new member wait while T are open.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from thundersync_jax.schedule import schedules
from thundersync_jax.schedule.schedules import Schedule


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
        schedule: str | Schedule,
        num_groups: int,
        group_size: int,
        max_chunk_tokens: int,
        max_open_groups: int | None = None,
        max_chunk_items: int | None = None,
        max_open_members: int | None = None,
    ):
        self.schedule = schedules.get(schedule)
        if num_groups < 1 or group_size < 1:
            raise ValueError(f"num_groups={num_groups}, group_size={group_size}: both must be >= 1")
        if max_chunk_tokens < 1:
            raise ValueError(f"max_chunk_tokens={max_chunk_tokens} must be >= 1")
        if max_open_groups is not None and max_open_groups < 1:
            raise ValueError(f"max_open_groups={max_open_groups} must be >= 1 or None")
        if max_chunk_items is not None and max_chunk_items < 1:
            raise ValueError(f"max_chunk_items={max_chunk_items} must be >= 1 or None")
        if max_open_members is not None and max_open_members < 1:
            raise ValueError(f"max_open_members={max_open_members} must be >= 1 or None")
        self.max_chunk_items = max_chunk_items
        self.max_open_members = max_open_members
        self._started: set[tuple[int, int]] = set()  # members with an item handed out
        self._ended: set[tuple[int, int]] = set()  # closing item handed out, or dropped
        self.open_members_peak = 0
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

    def drop_member(self, group: int, member: int | None = None) -> None:
        """A member will never arrive (its rollout failed for good): shrink the group."""
        if self._expected[group] <= self._members_in[group]:
            raise ValueError(f"group {group}: no outstanding member to drop")
        self._expected[group] -= 1
        if member is not None:
            self._ended.add((group, member))
        if self.group_complete(group):
            self._completed_at[group] = max(
                (it.arrival_s for it in self._pending if it.group == group), default=0.0
            )

    def exclude_groups(self, groups) -> None:
        """Groups another learner process streams (DESIGN §7): none of their members arrive here."""
        for k in groups:
            if self._members_in[k]:
                raise ValueError(f"group {k}: {self._members_in[k]} members already arrived here")
            self._expected[k] = 0
            self._completed_at[k] = 0.0

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

    def open_members(self) -> set[tuple[int, int]]:
        """(group, member) with items handed out whose work is not all handed out yet."""
        waiting = {(it.group, it.member) for it in self._pending}
        return {km for km in self._started if km not in self._ended or km in waiting}

    def _member_room(self, ready: list[WorkItem]) -> tuple[list[WorkItem], int | None]:
        """(ready items allowed by the open-member cap, new members still allowed or None)."""
        if self.max_open_members is None:
            return ready, None
        open_now = self.open_members()
        room = self.max_open_members - len(open_now)
        if room > 0:
            return ready, room
        return [it for it in ready if (it.group, it.member) in open_now], 0

    # -- decisions --------------------------------------------------------
    def _ready(self) -> list[WorkItem]:
        batch_complete = self.batch_complete()
        return [
            it
            for it in self._pending
            if self.schedule.item_ready(
                group_complete=self.group_complete(it.group), batch_complete=batch_complete
            )
        ]

    def rewards_differ(self, group: int) -> bool:
        """Whether the group's finished members already hold more than one reward."""
        return len(self._rewards_seen[group]) > 1

    def _priority(self, item: WorkItem) -> tuple:
        k = item.group
        return self.schedule.priority(
            group=k,
            member=item.member,
            item_id=item.item_id,
            arrival_s=item.arrival_s,
            completed_at=self._completed_at[k],
            group_complete=self.group_complete(k),
            rewards_differ=self.rewards_differ(k),
        )

    def chunk_kind(self, group: int) -> str:
        """The label of a chunk of `group` picked now (see `Schedule.chunk_kind`)."""
        return self.schedule.chunk_kind(
            group_complete=self.group_complete(group), rewards_differ=self.rewards_differ(group)
        )

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
        ready, room = self._member_room(ready)
        if not ready:
            return []  # backpressure: wait for an open member (trajectory) to close
        ready.sort(key=self._priority)
        head = ready[0]
        chunk, tokens, new_members = [], 0, set()
        for it in ready:
            if it.group != head.group or it.reward != head.reward:
                continue
            km = (it.group, it.member)
            if room is not None and km not in self._started and km not in new_members:
                if len(new_members) >= room:
                    continue
                new_members.add(km)
            if chunk and tokens + it.num_tokens > self.max_chunk_tokens:
                break
            if self.max_chunk_items is not None and len(chunk) >= self.max_chunk_items:
                break
            chunk.append(it)
            tokens += it.num_tokens
        taken = {id(it) for it in chunk}
        self._pending = [it for it in self._pending if id(it) not in taken]
        self._members_taken[head.group] += sum(it.closes_member for it in chunk)
        self.open_groups_peak = max(self.open_groups_peak, len(self.open_groups()))
        for it in chunk:
            self._started.add((it.group, it.member))
            if it.closes_member:
                self._ended.add((it.group, it.member))
        if self.max_open_members is not None:
            self.open_members_peak = max(self.open_members_peak, len(self.open_members()))
        return chunk

    def drain(self) -> Iterable[list[WorkItem]]:
        """All chunks ready right now, in order (for tests and the simulator)."""
        while chunk := self.next_chunk():
            yield chunk
