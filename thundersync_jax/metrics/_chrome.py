"""Chrome / Perfetto trace export of a step timeline (open in ui.perfetto.dev or chrome://tracing)."""

from __future__ import annotations

import json
import os
from typing import Any

from thundersync_jax.metrics._timeline import LEARNER_KINDS, ROLLOUT, Event, Timeline

_ROLLOUT_PID, _LEARNER_PID, _OTHER_PID = 1, 2, 3


def _event_name(e: Event) -> str:
    a = e.attrs
    if e.kind == ROLLOUT and "group" in a and "member" in a:
        return f"g{a['group']}m{a['member']}"
    if e.kind == "chunk":
        ids = a.get("ids", ())
        return f"{a.get('reason', 'chunk')} g{a.get('group', '?')} x{len(ids)}"
    return e.kind


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def chrome_trace_events(tl: Timeline) -> list[dict[str, Any]]:
    """Trace-event dicts: ph "X" complete events (µs from batch start) plus name metadata."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": _ROLLOUT_PID, "args": {"name": "rollouts"}},
        {"ph": "M", "name": "process_name", "pid": _LEARNER_PID, "args": {"name": "learner"}},
        {
            "ph": "M",
            "name": "thread_name",
            "pid": _LEARNER_PID,
            "tid": 0,
            "args": {"name": "learner"},
        },
    ]
    other_tids: dict[str, int] = {}
    rollout_tids: dict[Any, int] = {}
    for e in tl.events():
        if e.kind == ROLLOUT:
            pid = _ROLLOUT_PID
            key = e.attrs.get("traj_id", len(rollout_tids))
            if key not in rollout_tids:
                rollout_tids[key] = len(rollout_tids)
                out.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": rollout_tids[key],
                        "args": {"name": _event_name(e)},
                    }
                )
            tid = rollout_tids[key]
        elif e.kind in LEARNER_KINDS:
            pid, tid = _LEARNER_PID, 0
        else:
            pid = _OTHER_PID
            if e.kind not in other_tids:
                other_tids[e.kind] = len(other_tids)
                out.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": other_tids[e.kind],
                        "args": {"name": e.kind},
                    }
                )
            tid = other_tids[e.kind]
        out.append(
            {
                "name": _event_name(e),
                "cat": e.kind,
                "ph": "X",
                "ts": (e.start - tl.start_s) * 1e6,
                "dur": (e.end - e.start) * 1e6,
                "pid": pid,
                "tid": tid,
                "args": _json_safe(e.attrs),
            }
        )
    if other_tids:
        out.append(
            {"ph": "M", "name": "process_name", "pid": _OTHER_PID, "args": {"name": "other"}}
        )
    return out


def write_chrome_trace(tl: Timeline, path_json: str | os.PathLike) -> None:
    """Writes the timeline as a Chrome trace-event JSON object file."""
    doc = {
        "traceEvents": chrome_trace_events(tl),
        "displayTimeUnit": "ms",
        "otherData": {"schedule": tl.schedule or ""},
    }
    with open(path_json, "w", encoding="utf-8") as f:
        json.dump(doc, f)
