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
from typing import Any

import jax
import numpy as np
from flax import nnx

from thundersync_jax.learner import chunks, segments, segments_prompt
from thundersync_jax.models import qwen3
from thundersync_jax.schedule.opd_learner import TokenLogprobFn


def _block(tree: Any) -> None:
    jax.block_until_ready([x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)])


def median_seconds(call: Callable[[], Any], repeats: int, warmup: int) -> float:
    """Median wall seconds of `call()` (its result blocked on) after `warmup` calls."""
    for _ in range(warmup):
        _block(call())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _block(call())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
            start = time.perf_counter()
        traj, res = fns.score(params, traj, tokens[a:b], mask[a:b], teacher_logprobs=teacher[a:b])
        out.append(res.grad)
    deferred, traj = fns.close(params, traj)
    _block((out, deferred))
    return time.perf_counter() - start if tail_only else None


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
    one_shot = median_seconds(lambda: opd_one_shot(total_tokens, full_mask), repeats, warmup)
    bucket_cost = {
        b: median_seconds(lambda b=b: opd_one_shot(b, full_mask), repeats, warmup)
        for b in prefix_buckets
    }
    seg_lengths = sorted({b - a for n in turn_counts for a, b in _turns(tokens, n)})
    seg_buckets = sorted({max(x, 2) for x in seg_lengths} | {max(x - 1, 2) for x in seg_lengths})
    fns = segments.make_segment_fns(graphdef, cfg, seg_buckets, (total_tokens,))
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
        prefix = sum(bucket_cost[min(x for x in prefix_buckets if x >= b)] for _, b in turns)
        rows.append(
            dict(
                turns=n,
                segments_s=seg,
                segments_x=seg / one_shot,
                full_prefix_s=prefix,
                full_prefix_x=prefix / one_shot,
                ideal_full_prefix_x=(n + 1) / 2,
                tail_turn_s=statistics.median(tails),
                tail_trajectory_s=one_shot,
            )
        )
    return dict(one_shot_s=one_shot, bucket_cost_s=bucket_cost, rows=rows, compiles=fns.compiles)


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
    fns = segments.make_segment_fns(graphdef, cfg, buckets, (member_tokens,))
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
                per_member_s=base,
                shared_s=ours,
                saving=1 - ours / base,
                ideal_saving=share * (group_size - 1) / group_size,
            )
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The benchmark's tables."""
    opd = result["opd"]
    lines = [
        f"One-shot OPD gradient ({result['total_tokens']} tokens): {opd['one_shot_s']:.3f} s",
        "",
        "| turns | segments (s) | segments / one-shot | full prefix (s) | full prefix / one-shot"
        " | (n+1)/2 | tail `turn` (s) | tail `trajectory` (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in opd["rows"]:
        lines.append(
            f"| {r['turns']} | {r['segments_s']:.3f} | {r['segments_x']:.2f}x | "
            f"{r['full_prefix_s']:.3f} | {r['full_prefix_x']:.2f}x | {r['ideal_full_prefix_x']:.1f}"
            f" | {r['tail_turn_s']:.3f} | {r['tail_trajectory_s']:.3f} |"
        )
    lines += [
        "",
        f"GRPO, group of {result['group_size']} members of {result['member_tokens']} tokens:",
        "",
        "| prompt share | per-member prompts (s) | shared prompt (s) | saving "
        "| ideal (p·(G−1)/G) |",
        "|---|---|---|---|---|",
    ]
    for r in result["grpo"]:
        lines.append(
            f"| {r['prompt_share']:.0%} | {r['per_member_s']:.3f} | {r['shared_s']:.3f} | "
            f"{r['saving']:.1%} | {r['ideal_saving']:.1%} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """Two panels: OPD cost vs turns, GRPO saving vs prompt share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rows = result["opd"]["rows"]
    turns = [r["turns"] for r in rows]
    left.plot(turns, [r["segments_x"] for r in rows], "o-", label="segments (measured)")
    left.plot(turns, [r["full_prefix_x"] for r in rows], "s-", label="full prefix (measured)")
    left.plot(turns, [r["ideal_full_prefix_x"] for r in rows], ":", label="(n+1)/2")
    left.axhline(2.0, color="gray", lw=0.8, ls="--", label="target 2x")
    left.set(xscale="log", yscale="log", xlabel="turns per trajectory (same total tokens)")
    left.set(ylabel="learner work / one-shot gradient", title="OPD per turn")
    left.legend(fontsize=8)
    grpo = result["grpo"]
    shares = [100 * r["prompt_share"] for r in grpo]
    right.plot(shares, [100 * r["saving"] for r in grpo], "o-", label="measured")
    right.plot(shares, [100 * r["ideal_saving"] for r in grpo], ":", label="p·(G−1)/G")
    right.set(xlabel="prompt share of tokens (%)", ylabel="learner time saved (%)")
    right.set(title=f"GRPO shared prompt, G={result['group_size']}")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
