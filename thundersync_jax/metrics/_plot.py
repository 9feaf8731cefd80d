"""Step-timeline figure: one row per rollout, a learner row, opt step and publication marked."""

from __future__ import annotations

import os
import textwrap

from thundersync_jax.metrics import _timeline as T

# One color per reason a chunk ran (colorblind-safe Okabe-Ito palette), plus opt / publish.
LEARNER_COLORS = {
    "batch": "#0072B2",
    "group": "#CC79A7",
    "closed": "#009E73",
    "differing": "#E69F00",
    "open": "#56B4E9",
    T.CHUNK: "#0072B2",  # a chunk recorded without a `reason`
    T.OPT: "#000000",
    T.PUBLISH: "#D55E00",
}
_REWARD_COLORS = {"reward > 0": "#7fbf7f", "reward <= 0": "#bfbfbf", "rollout": "#9ab8d8"}
_MAX_ROW_LABELS = 40  # beyond this, label groups instead of trajectories


def _rollout_color(attrs: dict) -> str:
    if "reward" not in attrs:
        return _REWARD_COLORS["rollout"]
    return _REWARD_COLORS["reward > 0" if float(attrs["reward"]) > 0 else "reward <= 0"]


def _seconds(x: float) -> str:
    return f"{x:.0f} s" if abs(x) >= 100 else f"{x:.3g} s"


def _draw_rollouts(ax, rollouts: list[T.Event], t0: float) -> None:
    """Rollout bars top to bottom in (group, member) order, groups separated by rules."""
    n = len(rollouts)
    row_h = 0.8 if n <= _MAX_ROW_LABELS else 0.6
    ticks, labels = [], []
    groups = [e.attrs.get("group") for e in rollouts]
    for i, e in enumerate(rollouts):
        y = n - 1 - i
        ax.broken_barh(
            [(e.start - t0, e.end - e.start)],
            (y - row_h / 2, row_h),
            facecolors=_rollout_color(e.attrs),
            edgecolor="none",
        )
        new_group = i == 0 or groups[i] != groups[i - 1]
        if i > 0 and new_group:
            ax.axhline(y + 0.5, color="#d0d0d0", linewidth=0.6, zorder=0)
        if n <= _MAX_ROW_LABELS:
            ticks.append(y)
            labels.append(f"g{groups[i]}m{e.attrs.get('member', i)}")
        elif new_group:
            members = groups.count(groups[i])
            ticks.append(y - (members - 1) / 2)
            labels.append(f"g{groups[i]}")
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8 if len(ticks) <= 40 else 6)
    ax.set_ylim(-0.8, max(n, 1) - 0.2)
    ax.set_ylabel("rollouts (start → reward)", fontsize=9)


def _draw_learner(ax, learner: list[T.Event], t0: float) -> None:
    for e in learner:
        ax.broken_barh(
            [(e.start - t0, e.end - e.start)],
            (-0.4, 0.8),
            facecolors=LEARNER_COLORS.get(e.attrs.get("reason", e.kind), "#999999"),
            edgecolor="white",
            linewidth=0.5,
        )
    ax.set_yticks([0])
    ax.set_yticklabels(["learner"], fontsize=9)
    ax.set_ylim(-0.6, 0.6)


def _draw_milestones(ax_r, ax_l, tl: T.Timeline, rollouts: list[T.Event]) -> list[str]:
    """Marks the last reward and the publication across both rows; returns the title stats."""
    t0 = tl.start_s
    stats = []
    if rollouts:
        last = max(e.end for e in rollouts) - t0
        for ax in (ax_r, ax_l):
            ax.axvline(last, color="#444444", linestyle="--", linewidth=1)
        ax_r.annotate("last reward ", (last, 1.0), xycoords=("data", "axes fraction"),
                      ha="right", va="bottom", fontsize=8)  # fmt: skip
    if tl.events(T.PUBLISH):
        pub = T.step_time_s(tl)
        for ax in (ax_r, ax_l):
            ax.axvline(pub, color=LEARNER_COLORS[T.PUBLISH], linestyle="--", linewidth=1)
        ax_r.annotate(" published", (pub, 1.0), xycoords=("data", "axes fraction"),
                      ha="left", va="bottom", fontsize=8)  # fmt: skip
        stats.append(f"step {_seconds(pub)}")
        if rollouts:
            stats.append(f"learner idle {T.learner_idle_frac(tl):.0%}")
            stats.append(f"tail {_seconds(T.tail_s(tl))}")
    return stats


def _draw_legend(ax_r, rollouts: list[T.Event], learner: list[T.Event]) -> None:
    """Only the reward colors and learner kinds that appear."""
    from matplotlib.patches import Patch

    present = {e.attrs.get("reason", e.kind) for e in learner}
    colors_used = {_rollout_color(e.attrs) for e in rollouts}
    handles = [
        Patch(color=c, label=k if k == "rollout" else f"rollout, {k}")
        for k, c in _REWARD_COLORS.items()
        if c in colors_used
    ]
    handles += [
        Patch(color=c, label=k if k in (T.OPT, T.PUBLISH, T.CHUNK) else f"chunk: {k}")
        for k, c in LEARNER_COLORS.items()
        if k in present
    ]
    if handles:
        ax_r.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def plot_timeline(
    tl: T.Timeline,
    path_png: str | os.PathLike,
    *,
    title: str | None = None,
    command: str | None = None,
    dpi: int = 120,
) -> str:
    """Draws the step timeline to a PNG (Agg, no display needed); returns the path.

    Args:
      tl: the step's timeline (rollout, chunk, opt, publish events).
      path_png: output file.
      title: first title line; defaults to "<schedule> schedule". The step time,
        learner idle fraction and tail are appended when the step finished.
      command: the command that produced the run, shown under the title.
      dpi: resolution.
    """
    # Imported here so that importing metrics does not pay matplotlib's start-up cost;
    # the Agg canvas never touches pyplot's global backend (safe inside notebooks).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rollouts = sorted(
        tl.events(T.ROLLOUT), key=lambda e: (e.attrs.get("group", 0), e.attrs.get("member", 0))
    )
    learner = [e for e in tl.events() if e.kind in T.LEARNER_KINDS]
    rollout_in = min(0.2 * len(rollouts) + 0.6, 11.0)
    fig = Figure(figsize=(12, rollout_in + 2.6), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax_r, ax_l = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [rollout_in, 0.45]})
    t0 = tl.start_s
    _draw_rollouts(ax_r, rollouts, t0)
    _draw_learner(ax_l, learner, t0)

    stats = _draw_milestones(ax_r, ax_l, tl, rollouts)
    for ax in (ax_r, ax_l):
        ax.grid(axis="x", color="#eeeeee", linewidth=0.6)
        ax.set_axisbelow(True)
    ax_l.set_xlim(left=0)
    ax_l.set_xlabel("seconds from batch start")

    _draw_legend(ax_r, rollouts, learner)

    head = title or f"{tl.schedule or 'unknown'} schedule"
    if stats:
        head += " — " + ", ".join(stats)
    if command:
        head += "\n" + "\n".join(textwrap.wrap(f"$ {command}", 110))
    fig.suptitle(head, fontsize=10, x=0.02, ha="left")
    fig.savefig(path_png)
    return str(path_png)
