"""Learner work of segments vs one-shot and full-prefix gradients (used by bench_segments).

Three measurements, each side by side in one process (medians over repeats after warm-up):

1. OPD, one trajectory of T tokens split into n equal turns (first half of each turn an
   observation, second half the scored response). Relative to the one-shot OPD gradient
   (student log-prob forward + score gradient over the whole trajectory, what `sync` runs):
   * segments: n direct passes (the forward gives the log-probs) + the reverse sweep;
   * full prefix (today's per-turn mode): per turn, a log-prob forward and a score gradient
     over the whole prefix, padded to `prefix_step` buckets. Its time is the sum of the
     measured call times of each turn's bucket (every bucket timed in the same run).
2. The tail after the last turn is scored: `turn` granularity runs the last direct pass and
   the sweep; `trajectory` granularity runs the whole one-shot OPD gradient then.
3. GRPO: G members of L tokens sharing a prompt of share p. Per-member prompts: G score
   gradients over prompt + completion. Shared: one prompt forward, G completion passes
   against it, the tallies, and one prompt sweep at group close.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from thundersync_jax.learner import chunks, segments, segments_prompt
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.models import qwen3


def _block(tree: Any) -> None:
    jax.block_until_ready([x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)])


class Timing(NamedTuple):
    """Median seconds of a measured call.

    Attributes:
      wall: wall-clock seconds.
      cpu: process CPU seconds (all threads): on a shared machine, the work this process did,
        less disturbed by other processes than wall time.
    """

    wall: float
    cpu: float

    def __add__(self, other):  # sums of timings (the full-prefix total)
        return Timing(self.wall + other[0], self.cpu + other[1])

    def ratio(self, other: Timing) -> Timing:
        return Timing(self.wall / other.wall, self.cpu / other.cpu)


def median_seconds(call: Callable[[], Any], repeats: int, warmup: int) -> Timing:
    """Median wall and CPU seconds of `call()` (its result blocked on) after `warmup` calls."""
    for _ in range(warmup):
        _block(call())
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        _block(call())
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return Timing(statistics.median(wall), statistics.median(cpu))


def build(model_config: dict[str, Any], seed: int = 0) -> tuple[Any, Any, qwen3.Qwen3Config]:
    """(graphdef, float32 params, config) of a random Qwen3 of `model_config` (HF keys)."""
    cfg = qwen3.Qwen3Config(**model_config)
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param
    )
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: rng.normal(0, 0.02, x.shape).astype(np.float32), abstract)
    return graphdef, jax.device_put(params), cfg


def _turns(tokens: np.ndarray, n: int) -> list[tuple[int, int]]:
    cuts = np.linspace(0, len(tokens), n + 1).round().astype(int)
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _turn_mask(length: int, turns: Sequence[tuple[int, int]]) -> np.ndarray:
    mask = np.zeros(length, np.float32)
    for a, b in turns:
        mask[(a + b) // 2 : b] = 1  # response = second half of the turn
    mask[0] = 0
    return mask


def _opd_segments(fns, params, tokens, mask, teacher, turns, tail_only=False):
    """Runs one trajectory through the segment passes; returns the last work's outputs."""
    traj, out = fns.open(len(tokens)), []
    for j, (a, b) in enumerate(turns):
        if tail_only and j == len(turns) - 1:
            _block((traj.k, traj.dk))
            start, start_cpu = time.perf_counter(), time.process_time()
        traj, res = fns.score(params, traj, tokens[a:b], mask[a:b], teacher_logprobs=teacher[a:b])
        out.append(res.grad)
    deferred, traj = fns.close(params, traj)
    _block((out, deferred))
    if not tail_only:
        return None
    return Timing(time.perf_counter() - start, time.process_time() - start_cpu)


def _bench_segment_fns(graphdef, cfg, tokens, turn_counts: Sequence[int]):
    """Segment functions bucketed for every turn split the bench measures."""
    total_tokens = len(tokens)
    seg_lengths = sorted({b - a for n in turn_counts for a, b in _turns(tokens, n)})
    seg_buckets = sorted(
        {max(x, 2) for x in seg_lengths}
        | {max(x - 1, 2) for x in seg_lengths}
        | {c for c in (128, 256, 512) if c < total_tokens}
        | {total_tokens}  # the sweep's blocks (up to the largest bucket)
    )
    cache_buckets = [c for c in (64, 128, 256, 512, 1024, 2048, 4096) if c < total_tokens]
    return segments.make_segment_fns(graphdef, cfg, seg_buckets, (*cache_buckets, total_tokens))


def opd_costs(
    graphdef,
    params,
    cfg,
    total_tokens: int,
    turn_counts: Sequence[int],
    *,
    prefix_step: int,
    repeats: int,
    warmup: int,
    seed: int = 0,
) -> dict[str, Any]:
    """Measurements 1 and 2 (see the module docstring)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, cfg.vocab_size, total_tokens).astype(np.int32)
    teacher = -rng.uniform(0.5, 4.0, total_tokens).astype(np.float32)
    prefix_buckets = tuple(range(prefix_step, total_tokens + prefix_step, prefix_step))
    score = chunks.make_score_grad_fn(graphdef, prefix_buckets)
    logprob = TokenLogprobFn(score)

    def opd_one_shot(length, mask):
        student = logprob(params, tokens[None, :length])
        adv = np.where(mask[:length] > 0, teacher[:length] - student[0], 0).astype(np.float32)
        return score(params, tokens[None, :length], mask[None, :length], adv[None])[0]

    full_mask = _turn_mask(total_tokens, _turns(tokens, max(turn_counts)))
    weights = np.where(full_mask > 0, teacher, 0)[None].astype(np.float32)
    grad_only = median_seconds(
        lambda: score(params, tokens[None], full_mask[None], weights)[0], repeats, warmup
    )
    one_shot = median_seconds(lambda: opd_one_shot(total_tokens, full_mask), repeats, warmup)
    bucket_cost = {
        b: median_seconds(lambda b=b: opd_one_shot(b, full_mask), repeats, warmup)
        for b in prefix_buckets
    }
    fns = _bench_segment_fns(graphdef, cfg, tokens, turn_counts)
    rows = []
    for n in turn_counts:
        turns = _turns(tokens, n)
        mask = _turn_mask(total_tokens, turns)
        seg = median_seconds(
            lambda turns=turns, mask=mask: _opd_segments(fns, params, tokens, mask, teacher, turns),
            repeats,
            warmup,
        )
        tails = [
            _opd_segments(fns, params, tokens, mask, teacher, turns, tail_only=True)
            for _ in range(repeats)
        ]
        tail_turn = Timing(
            statistics.median(t.wall for t in tails), statistics.median(t.cpu for t in tails)
        )
        prefix = Timing(0.0, 0.0)
        for _, b in turns:
            prefix = prefix + bucket_cost[min(x for x in prefix_buckets if x >= b)]
        rows.append(
            dict(
                turns=n,
                segments=seg,
                segments_x=seg.ratio(one_shot),
                segments_x_grad_only=seg.ratio(grad_only),
                full_prefix=prefix,
                full_prefix_x=prefix.ratio(one_shot),
                ideal_full_prefix_x=(n + 1) / 2,
                tail_turn=tail_turn,  # median over repeats: last direct pass + the sweep
                tail_trajectory=one_shot,  # the whole one-shot OPD gradient runs then
                tail_x=tail_turn.ratio(one_shot),
            )
        )
    return dict(
        one_shot=one_shot,
        grad_only=grad_only,
        bucket_cost={str(k): v for k, v in bucket_cost.items()},
        rows=rows,
        compiles=fns.compiles,
    )


def _per_member_prompts(fns, score, params, prompt, completions, rewards):
    """Today's GRPO learner work for a group: one score gradient per member."""
    del fns, rewards
    out = []
    for c in completions:
        seq = np.concatenate([prompt, c])[None]
        mask = np.zeros_like(seq, np.float32)
        mask[0, len(prompt) :] = 1
        out.append(score(params, seq, mask)[0])
    return out


def _shared_prompt(fns, score, params, prompt, completions, rewards):
    """The group with its prompt forwarded once and backpropagated once (drgrpo scalars)."""
    del score
    group, out = segments_prompt.open_group(fns, params, prompt), []
    for c, r in zip(completions, rewards, strict=True):
        traj, res = fns.score(params, segments_prompt.member(fns, group), c, np.ones(len(c)))
        _, traj = fns.close(params, traj)
        # w_i = 1 (seq-mean-token-sum): the weights do not change the work.
        group = segments_prompt.add_member(group, traj, r, 1.0)
        out.append(res.grad)
    scalars = (1.0, -float(np.mean(rewards - rewards[0])), float(rewards[0]))
    return out, segments_prompt.close_group(fns, params, group, scalars)


def grpo_prompt_costs(
    graphdef,
    params,
    cfg,
    member_tokens: int,
    group_size: int,
    shares: Sequence[float],
    *,
    repeats: int,
    warmup: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Measurement 3: per-member vs shared prompts for one group, at each prompt share."""
    rng = np.random.default_rng(seed)
    score = chunks.make_score_grad_fn(graphdef, (member_tokens,))
    lengths = sorted({int(round(s * member_tokens)) for s in shares})
    buckets = sorted(
        {max(x, 2) for x in lengths}
        | {max(x - 1, 2) for x in lengths}
        | {max(member_tokens - x, 2) for x in lengths}
    )
    cache_buckets = [c for c in (64, 128, 256, 512, 1024, 2048) if c < member_tokens]
    fns = segments.make_segment_fns(graphdef, cfg, buckets, (*cache_buckets, member_tokens))
    rows = []
    for share in shares:
        p = int(round(share * member_tokens))
        prompt = rng.integers(1, cfg.vocab_size, p).astype(np.int32)
        completions = rng.integers(1, cfg.vocab_size, (group_size, member_tokens - p))
        rewards = rng.normal(size=group_size)

        args = (fns, score, params, prompt, completions, rewards)
        base = median_seconds(lambda args=args: _per_member_prompts(*args), repeats, warmup)
        ours = median_seconds(lambda args=args: _shared_prompt(*args), repeats, warmup)
        rows.append(
            dict(
                prompt_share=share,
                per_member=base,
                shared=ours,
                saving=Timing(1 - ours.wall / base.wall, 1 - ours.cpu / base.cpu),
                ideal_saving=share * (group_size - 1) / group_size,
            )
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The benchmark's tables (ratios as CPU-time / wall-time)."""
    opd = result["opd"]
    one, grad = opd["one_shot"], opd["grad_only"]
    lines = [
        f"One-shot OPD gradient ({result['total_tokens']} tokens; student log-prob forward + "
        f"score gradient): {one.cpu:.2f} s CPU, {one.wall:.2f} s wall; score gradient alone: "
        f"{grad.cpu:.2f} s CPU, {grad.wall:.2f} s wall. Ratios: CPU time (wall time).",
        "",
        "| turns | segments / one-shot OPD | segments / score gradient alone "
        "| full prefix / one-shot OPD | (n+1)/2 | tail `turn` CPU s (wall) "
        "| tail `trajectory` CPU s (wall) | tail turn / trajectory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in opd["rows"]:
        seg, alone, pre = r["segments_x"], r["segments_x_grad_only"], r["full_prefix_x"]
        lines.append(
            f"| {r['turns']} | {seg.cpu:.2f}x ({seg.wall:.2f}x) | {alone.cpu:.2f}x "
            f"({alone.wall:.2f}x) | {pre.cpu:.2f}x ({pre.wall:.2f}x) | "
            f"{r['ideal_full_prefix_x']:.1f} | "
            f"{r['tail_turn'].cpu:.3f} ({r['tail_turn'].wall:.3f}) "
            f"| {r['tail_trajectory'].cpu:.3f} ({r['tail_trajectory'].wall:.3f}) "
            f"| {r['tail_x'].cpu:.2f}x ({r['tail_x'].wall:.2f}x) |"
        )
    lines += [
        "",
        f"GRPO, group of {result['group_size']} members of {result['member_tokens']} tokens "
        "(CPU s; wall s in parentheses):",
        "",
        "| prompt share | per-member prompts | shared prompt | saving | ideal p·(G−1)/G |",
        "|---|---|---|---|---|",
    ]
    for r in result["grpo"]:
        base, ours, save = r["per_member"], r["shared"], r["saving"]
        lines.append(
            f"| {r['prompt_share']:.0%} | {base.cpu:.2f} ({base.wall:.2f}) | {ours.cpu:.2f} "
            f"({ours.wall:.2f}) | {save.cpu:.1%} ({save.wall:.1%}) | {r['ideal_saving']:.1%} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """Two panels: OPD cost vs turns, GRPO saving vs prompt share (CPU-time ratios)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rows = result["opd"]["rows"]
    turns = [r["turns"] for r in rows]
    left.plot(turns, [r["segments_x"].cpu for r in rows], "o-", label="segments / one-shot OPD")
    left.plot(
        turns, [r["segments_x_grad_only"].cpu for r in rows], "^-", label="segments / score grad"
    )
    left.plot(turns, [r["full_prefix_x"].cpu for r in rows], "s-", label="full prefix (today)")
    left.plot(turns, [r["ideal_full_prefix_x"] for r in rows], ":", label="(n+1)/2")
    left.plot(
        turns, [r["tail_x"].cpu for r in rows], "d--", label="tail after last score: turn / traj."
    )
    left.axhline(2.0, color="gray", lw=0.8, ls="--", label="target 2x")
    left.set(xscale="log", yscale="log", xlabel="turns per trajectory (same total tokens)")
    left.set(ylabel="learner CPU time / one-shot", title="OPD per turn")
    left.legend(fontsize=8)
    grpo = result["grpo"]
    shares = [100 * r["prompt_share"] for r in grpo]
    right.plot(shares, [100 * r["saving"].cpu for r in grpo], "o-", label="measured (CPU time)")
    right.plot(shares, [100 * r["ideal_saving"] for r in grpo], ":", label="p·(G−1)/G")
    right.set(xlabel="prompt share of tokens (%)", ylabel="learner time saved (%)")
    right.set(title=f"GRPO shared prompt, G={result['group_size']}")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
