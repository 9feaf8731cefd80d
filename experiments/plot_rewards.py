r"""Plots mean reward per step from a run's metrics.jsonl (for the README).

    python -m experiments.plot_rewards --workdir=runs/cpu --out=docs/cpu_reward_curve.png

Draws reward_mean per step, a trailing 5-step mean, and the first-5 / last-5 means
that the `make run` acceptance check compares (printed as well); with held-out evaluation in
the run (`--config.eval.every_steps=N`), its `eval_pass@1` and `eval_pass@k` on the same axes.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # headless: this only ever writes a file
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from thundersync_jax.metrics import read_metrics  # noqa: E402

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """The command line's flags (defined when run as a script, so importing the plotting
    functions next to other absl programs never clashes on flag names)."""
    flags.DEFINE_string("workdir", "runs/cpu", "Run directory holding metrics.jsonl.")
    flags.DEFINE_string("out", "docs/cpu_reward_curve.png", "Where to write the PNG.")
    flags.DEFINE_string("title", "", "Plot title (default: GRPO reward (WORKDIR)).")
    flags.DEFINE_integer("window", 5, "Steps in the first/last and trailing means.")


def read_rewards(metrics_path: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, reward_mean) from a metrics.jsonl, sorted by step; the last line of a step wins."""
    by_step = {int(m["step"]): float(m["reward_mean"]) for m in read_metrics(metrics_path)}
    if not by_step:
        raise ValueError(f"{metrics_path} has no metric lines")
    steps = np.array(sorted(by_step))
    return steps, np.array([by_step[s] for s in steps])


def read_eval(metrics_path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"eval_pass@1": (steps, values), "eval_pass@k": ...} of the evaluated steps ({} if none)."""
    by_key: dict[str, dict[int, float]] = {}
    for m in read_metrics(metrics_path):
        for key, value in m.items():
            if key.startswith("eval_pass@"):
                by_key.setdefault(key, {})[int(m["step"])] = float(value)
    return {
        key: (np.array(sorted(v)), np.array([v[s] for s in sorted(v)]))
        for key, v in sorted(by_key.items())
    }


def first_last_means(rewards: np.ndarray, window: int) -> tuple[float, float]:
    """Mean reward of the first and of the last `window` steps."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return float(np.mean(rewards[:window])), float(np.mean(rewards[-window:]))


def plot(
    steps: np.ndarray,
    rewards: np.ndarray,
    window: int,
    out: str,
    title: str,
    evals: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> None:
    """Writes a small PNG: per-step reward, trailing mean, first/last window means, and the
    held-out pass@k curves of `evals` (from `read_eval`)."""
    first, last = first_last_means(rewards, window)
    trailing = np.array(
        [rewards[max(0, i - window + 1) : i + 1].mean() for i in range(len(rewards))]
    )
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    ax.plot(steps, rewards, "o-", ms=3, lw=1, alpha=0.6, label="reward_mean (per step)")
    ax.plot(steps, trailing, lw=2, label=f"trailing {window}-step mean")
    ax.hlines(first, steps[0], steps[min(window, len(steps)) - 1], colors="C2", lw=3)
    ax.hlines(last, steps[-min(window, len(steps))], steps[-1], colors="C3", lw=3)
    ax.annotate(
        f"first {window}: {first:.2f}",
        (steps[0], first),
        textcoords="offset points",
        xytext=(0, 6),
        color="C2",
        fontsize=8,
    )
    ax.annotate(
        f"last {window}: {last:.2f}",
        (steps[-min(window, len(steps))], last),
        textcoords="offset points",
        xytext=(0, 6),
        color="C3",
        fontsize=8,
    )
    for i, (key, (at, values)) in enumerate((evals or {}).items()):
        ax.plot(at, values, "s--", ms=4, lw=1.5, color=f"C{4 + i}", label=f"held-out {key[5:]}")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward / pass@k" if evals else "mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv):
    del argv
    path = os.path.join(FLAGS.workdir, "metrics.jsonl")
    steps, rewards = read_rewards(path)
    evals = read_eval(path)
    first, last = first_last_means(rewards, FLAGS.window)
    title = FLAGS.title or f"GRPO reward ({FLAGS.workdir})"
    plot(steps, rewards, FLAGS.window, FLAGS.out, title, evals)
    for key, (at, values) in evals.items():
        print(f"{key}: " + " ".join(f"{s}:{v:.3f}" for s, v in zip(at, values, strict=True)))
    print(
        f"steps={len(steps)} first{FLAGS.window}={first:.3f} last{FLAGS.window}={last:.3f} "
        f"delta={last - first:+.3f} -> {FLAGS.out}"
    )


if __name__ == "__main__":
    _define_flags()
    app.run(main)
