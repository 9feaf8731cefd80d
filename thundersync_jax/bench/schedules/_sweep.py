"""The schedule benchmark over a grid of balance × sigma × group_icc: table and plot.

One process, one learner: every chunk shape compiles once for the whole grid,
and each grid point recalibrates its cost model (cheap once compiled) before
its rounds, so slow drifts of a shared machine do not leak from point to point.
"""

from __future__ import annotations

import itertools
import json
import os
import time

import ml_collections

from thundersync_jax.bench.schedules._learner import BenchLearner, learner_from_config
from thundersync_jax.bench.schedules._run import run_benchmark


def _point(result: dict, balance: float, sigma: float, icc: float) -> dict:
    rows = result["schedules"]
    out = {"balance": balance, "sigma": sigma, "group_icc": icc}
    for s, row in rows.items():
        out[f"{s}_step_time_s"] = row["step_time_s"]
        out[f"{s}_predicted_step_time_s"] = row["predicted_step_time_s"]
        out[f"{s}_error"] = row["predicted_error"]
        out[f"{s}_affine_error"] = row["predicted_affine_error"]
        out[f"{s}_idle"] = row["learner_idle_frac"]
        if s != "sync":
            out[f"{s}_speedup"] = row["speedup_vs_sync"]
            out[f"{s}_predicted_speedup"] = row["predicted_speedup_vs_sync"]
    return out


def sweep_table(points: list[dict], command: str) -> str:
    """Markdown: the command, then one row per grid point."""
    lines = [
        f"Command: `{command}`",
        "",
        "| balance | sigma | icc | stream × (meas / pred) | group × (meas / pred) "
        "| pred. error sync / group / stream | stream idle |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p['balance']:g} | {p['sigma']:g} | {p['group_icc']:g} "
            f"| {p['stream_speedup']:.2f} / {p['stream_predicted_speedup']:.2f} "
            f"| {p['group_speedup']:.2f} / {p['group_predicted_speedup']:.2f} "
            f"| {100 * p['sync_error']:+.1f}% / {100 * p['group_error']:+.1f}% / "
            f"{100 * p['stream_error']:+.1f}% | {p['stream_idle']:.3f} |"
        )
    errs = [abs(p[f"{s}_error"]) for p in points for s in ("sync", "group", "stream")]
    lin = [abs(p[f"{s}_affine_error"]) for p in points for s in ("sync", "group", "stream")]
    lines += [
        "",
        f"|predicted − measured| / predicted step time over every point and schedule: "
        f"mean {100 * sum(errs) / len(errs):.1f}%, largest {100 * max(errs):.1f}% "
        f"(per-shape cost table); with the plain fixed + per-token line: mean "
        f"{100 * sum(lin) / len(lin):.1f}%, largest {100 * max(lin):.1f}%.",
    ]
    return "\n".join(lines)


def sweep_plot(points: list[dict], path: str, command: str = "") -> None:
    """Measured (markers) vs predicted (lines) speedup over sync against balance.

    `command`, when given, is printed under the plot (the figure names its command).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True, dpi=80)
    series = sorted({(p["sigma"], p["group_icc"]) for p in points})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, s in zip(axes, ("stream", "group"), strict=True):
        for c, (sigma, icc) in zip(itertools.cycle(colors), series):
            pts = sorted(
                (p for p in points if (p["sigma"], p["group_icc"]) == (sigma, icc)),
                key=lambda p: p["balance"],
            )
            x = [p["balance"] for p in pts]
            ax.plot(x, [p[f"{s}_predicted_speedup"] for p in pts], "-", color=c)
            ax.plot(
                x, [p[f"{s}_speedup"] for p in pts], "o", color=c, label=f"σ={sigma:g} icc={icc:g}"
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("balance (learner work / rollout span)")
        ax.set_title(f"{s} over sync: measured (o) vs predicted (—)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup per step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    if command:
        fig.subplots_adjust(bottom=0.22)
        fig.text(0.01, 0.01, command, fontsize=7, family="monospace")
    fig.savefig(path)
    plt.close(fig)


def run_sweep(
    config: ml_collections.ConfigDict,
    workdir: str,
    command: str = "",
    learner: BenchLearner | None = None,
) -> list[dict]:
    """Runs `run_benchmark` at every (sigma, group_icc, balance) of `config.sweep`.

    Writes DIR/sweep.json (the points, each bench result under "runs"),
    DIR/sweep.md (table) and DIR/sweep.png (plot); returns the points.
    """
    os.makedirs(workdir, exist_ok=True)
    learner = learner or learner_from_config(config)
    points, runs = [], []
    start = time.perf_counter()
    grid = itertools.product(config.sweep.sigmas, config.sweep.group_iccs, config.sweep.balances)
    for sigma, icc, balance in grid:
        cfg = config.copy_and_resolve_references()
        cfg.sigma, cfg.group_icc, cfg.balance = float(sigma), float(icc), float(balance)
        result = run_benchmark(cfg, None, learner=learner)
        points.append(_point(result, float(balance), float(sigma), float(icc)))
        runs.append(result)
        with open(os.path.join(workdir, "sweep.json"), "w") as f:  # partial results survive
            json.dump({"points": points, "runs": runs}, f, indent=2, default=list)
    command = command or (
        "python -m experiments.bench_schedules --config=configs/bench_cpu.py:sweep --workdir=DIR"
    )
    with open(os.path.join(workdir, "sweep.md"), "w") as f:
        f.write(sweep_table(points, command) + "\n")
        f.write(f"\nWall time: {time.perf_counter() - start:.0f} s.\n")
    sweep_plot(points, os.path.join(workdir, "sweep.png"), command)
    return points
