"""Bridges between recorded timelines and the simulator.

`export_arrivals` turns a training step's timeline into the arrival trace the simulator
replays; `timeline_from_sim` draws a simulated step as a timeline (for the same plots and
Chrome traces as a real run). They live with the simulator, not in `metrics`, because
`metrics` is the bottom layer and must not import `sim` (issue 13, item 6).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from thundersync_jax.metrics import CHUNK, OPT, PUBLISH, ROLLOUT, Timeline
from thundersync_jax.sim import Arrival, SimResult, write_trace

_ROLLOUT_ATTRS = ("traj_id", "group", "member", "tokens", "reward")


def arrivals_from_timeline(tl: Timeline, step: int = 0) -> list[Arrival]:
    """The step's arrivals (reward-known times relative to batch start) from its rollout events.

    Rollout events need attrs traj_id, group, member, tokens and reward. An
    integer traj_id is kept; any other id (e.g. "g3m1") is replaced by the
    trajectory's rank in (group, member) order, the order the simulator's sync
    schedule packs in.
    """
    events = sorted(tl.events(ROLLOUT), key=lambda e: (e.attrs.get("group"), e.attrs.get("member")))
    for e in events:
        missing = [k for k in _ROLLOUT_ATTRS if k not in e.attrs]
        if missing:
            raise ValueError(f"rollout event {e.attrs} lacks {missing}: cannot export an arrival")
    keep_ids = all(isinstance(e.attrs["traj_id"], int) for e in events)
    out = []
    for rank, e in enumerate(events):
        a = e.attrs
        out.append(
            Arrival(
                traj_id=int(a["traj_id"]) if keep_ids else rank,
                group=int(a["group"]),
                member=int(a["member"]),
                arrival_s=e.end - tl.start_s,
                tokens=int(a["tokens"]),
                reward=float(a["reward"]),
                step=int(step),
            )
        )
    return sorted(out, key=lambda r: r.traj_id)


def export_arrivals(tl: Timeline, path: str | os.PathLike, step: int) -> list[Arrival]:
    """Appends the step's arrivals to a JSONL trace the simulator can replay; returns them."""
    arrivals = arrivals_from_timeline(tl, step)
    write_trace(path, arrivals, append=True)
    return arrivals


def timeline_from_sim(trace: Sequence[Arrival], result: SimResult) -> Timeline:
    """A timeline (batch start 0) of a simulated step, for plots and trace export.

    Rollouts run from 0 to their arrival; learner chunks, opt and publish come
    from `result.chunks`.
    """
    tl = Timeline(start_s=0.0, schedule=result.schedule)
    by_id = {a.traj_id: a for a in trace}
    for a in trace:
        tl.record(
            ROLLOUT,
            0.0,
            a.arrival_s,
            traj_id=a.traj_id,
            group=a.group,
            member=a.member,
            tokens=a.tokens,
            reward=a.reward,
        )
    for c in result.chunks:
        if c.kind == "opt":
            tl.record(OPT, c.start, c.end)
        elif c.kind == "publish":
            tl.record(PUBLISH, c.start, c.end)
        else:
            unknown = [i for i in c.ids if i not in by_id]
            if unknown:
                raise ValueError(f"sim chunk refers to traj_ids {unknown} not in the trace")
            tl.record(CHUNK, c.start, c.end, reason=c.kind, group=by_id[c.ids[0]].group, ids=c.ids)
    return tl
