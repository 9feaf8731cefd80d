"""OPD's open trajectories on the learner: per-turn segments (`turn`) or one gradient.

`rl.opd_granularity` picks how a member's scored turns become gradient (DESIGN §2, "Segments:
linear cost"):

* `turn`: each turn, once scored, runs the segment forward over its new tokens only against
  the trajectory's own learner KV cache at the batch θ (`learner.segments`). That forward gives
  the student log-probs for Â, its direct gradient goes into the accumulator at once, and its
  cotangents for the cached keys/values go into the trajectory's buffer; when the trajectory
  closes (its end, or its loss, arrived and every turn it emitted is in) one reverse sweep adds
  the deferred part. Each token is forwarded once and backpropagated at most twice, whatever
  the turn count.
* `trajectory`: the turns are kept on the host and, when the trajectory closes, one forward for
  the student log-probs and one score gradient over the whole trajectory, every scored turn
  masked in (the one-shot gradient; nothing overlaps the rollout).

Both equal the full-trajectory OPD gradient. The forward that gives log π_s (the direct pass,
or the one-shot score gradient) also gives the engine/learner gap sums of the scored tokens
and, with `rl.tis_cap`, weights each by min(π_s / π_engine, cap) (`Folded.gap`).

Turns must be folded in order (the cache only grows), but the teacher may finish them out of
order: a turn whose predecessor has not arrived waits in `held`; on close the held turns are
folded in turn order, so a lost turn (its teacher call failed) is a gap of unscored tokens,
exactly as in the one-shot gradient.

Everything here is a pure function of `OpenTrajectory` values (host numbers and device arrays);
the per-batch `opd.OpdState` threads them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from thundersync_jax.learner import buckets

GRANULARITIES = ("turn", "trajectory", "auto")


class OpenTrajectory(NamedTuple):
    """One member's trajectory while the learner still folds turns of it in.

    Attributes:
      cache: turn granularity: the learner's `segments.Trajectory` (KV cache at θ and the
        cotangent buffers); None before the first turn and under `trajectory` granularity.
      seen: int32 [S] the trajectory's tokens the learner has taken in so far (host copy: a
        later turn's prefix must start with them).
      scored: float32 [S] 1 on the tokens scored so far (the regularizer terms' mask at close).
      teacher_logprobs: float32 [S] log π_T of the scored tokens (trajectory granularity).
      engine_logprobs: float32 [S] the sampling engine's log-probs of the scored tokens (NaN
        where it gave none; trajectory granularity).
      routes: MoE policies: int32 [S, M, K] the engine's routes of the tokens seen, from the
        latest turn that reported some (its request covers every earlier token), -1 where
        none; None when no turn had routes (trajectory granularity replays them).
      next_turn: the turn index folded in next.
      held: turns that arrived before an earlier one, sorted by turn index.
      folded: turns folded in.
      expected: turns the member emitted (known once its closing item arrived), else None.
    """

    cache: Any = None
    seen: np.ndarray = np.zeros(0, np.int32)
    scored: np.ndarray = np.zeros(0, np.float32)
    teacher_logprobs: np.ndarray = np.zeros(0, np.float32)
    engine_logprobs: np.ndarray = np.zeros(0, np.float32)
    routes: np.ndarray | None = None
    next_turn: int = 0
    held: tuple = ()
    folded: int = 0
    expected: int | None = None

    @property
    def complete(self) -> bool:
        """Every turn the member emitted has arrived (so it can close)."""
        return self.expected is not None and self.folded + len(self.held) >= self.expected

    @property
    def nbytes(self) -> int:
        """Device bytes kept for it (the cache and cotangent buffers; 0 under `trajectory`)."""
        return 0 if self.cache is None else int(self.cache.nbytes)


class Folded(NamedTuple):
    """What folding turns in added: (accumulator state, scored tokens, Σ log π_s − log π_T,
    the engine/learner gap sums of those tokens or None)."""

    acc: Any
    tokens: int
    log_ratio_sum: float
    gap: dict | None = None


def check_granularity(value: str) -> str:
    if value not in GRANULARITIES:
        raise ValueError(
            f"rl.opd_granularity={value!r}; valid: {', '.join(GRANULARITIES)} (turn: per-turn "
            "segments over the learner's cache; trajectory: one gradient when it ends)"
        )
    return value


def extend(traj: OpenTrajectory, payload) -> tuple[OpenTrajectory, np.ndarray, np.ndarray, Any]:
    """(traj with the payload's new tokens taken in, new tokens, their mask, their log π_T).

    The new tokens' engine log-probs are in `traj.engine_logprobs[-len(new):]` (NaN: none).

    Raises ValueError when the turn's prefix does not continue what the learner has seen (a
    turn folded twice, or an environment whose transcript is not append-only).
    """
    done = len(traj.seen)
    tokens = np.asarray(payload.tokens, np.int32)
    if len(tokens) <= done or not np.array_equal(tokens[:done], traj.seen):
        raise ValueError(
            f"turn {payload.turn}: its {len(tokens)}-token prefix does not continue the "
            f"{done} tokens the learner already took in for this trajectory"
        )
    mask = np.asarray(payload.loss_mask, np.float32)[done:]
    t_lp = np.asarray(payload.teacher_logprobs, np.float32)[done:]
    new = tokens[done:]
    engine = getattr(payload, "engine_logprobs", None)
    e_lp = np.full(len(new), np.nan, np.float32) if engine is None else engine[done:]
    routes = getattr(payload, "routes", None)
    if routes is None and traj.routes is not None:  # keep the earlier turns' routes
        routes = np.full((len(tokens), *traj.routes.shape[1:]), -1, np.int32)
        routes[: len(traj.routes)] = traj.routes
    traj = traj._replace(
        routes=routes,
        seen=tokens.copy(),
        scored=np.concatenate([traj.scored, mask]),
        teacher_logprobs=np.concatenate([traj.teacher_logprobs, t_lp]),
        engine_logprobs=np.concatenate([traj.engine_logprobs, np.asarray(e_lp, np.float32)]),
    )
    return traj, new, mask, t_lp


def hold(traj: OpenTrajectory, payload) -> OpenTrajectory:
    """The turn queued in turn order (it is folded once its predecessors are)."""
    if payload.turn < traj.next_turn or any(p.turn == payload.turn for p in traj.held):
        raise ValueError(f"turn {payload.turn} of this trajectory arrived twice")
    return traj._replace(held=tuple(sorted((*traj.held, payload), key=lambda p: p.turn)))


def ready_turns(traj: OpenTrajectory, flush: bool) -> tuple[OpenTrajectory, tuple]:
    """(traj without them, the held turns to fold now): the next in order, or all on `flush`."""
    take = []
    nxt = traj.next_turn
    for p in traj.held:
        if p.turn != nxt and not flush:
            break
        take.append(p)
        nxt = p.turn + 1
    rest = traj.held[len(take) :]
    return traj._replace(held=rest, next_turn=nxt, folded=traj.folded + len(take)), tuple(take)


class TurnSegments:
    """`turn` granularity: fold a turn as one segment, sweep on close (see module doc)."""

    def __init__(self, segment_fns, add):
        self.fns = segment_fns
        self._add = add  # jitted acc.add_weighted

    def fold(self, policy, acc, traj: OpenTrajectory, payload) -> tuple[OpenTrajectory, Folded]:
        traj, new, mask, t_lp = extend(traj, payload)
        cache = traj.cache if traj.cache is not None else self.fns.open()
        cache, res = self.fns.score(
            policy.params,
            cache,
            new,
            mask,
            teacher_logprobs=t_lp,
            engine_logprobs=traj.engine_logprobs[len(traj.seen) - len(new) :],
            base_params=policy.base_params,
        )
        if res.grad is not None:
            acc = self._add(acc, res.grad, res.num_tokens, 1)
        # weights = Â_t = log π_T − log π_s on scored tokens (0 elsewhere).
        log_ratio = float(-np.sum(res.weights, dtype=np.float64))
        return traj._replace(cache=cache), Folded(acc, res.num_tokens, log_ratio, res.gap)

    def close(self, policy, acc, traj: OpenTrajectory) -> Folded:
        if traj.cache is None:
            return Folded(acc, 0, 0.0)
        deferred, _ = self.fns.close(policy.params, traj.cache, base_params=policy.base_params)
        if deferred is not None:  # None: one segment, nothing read its keys/values
            # The sweep's gradient has no tokens of its own (0: the normaliser counts each once).
            acc = self._add(acc, deferred, 0, 1)
        return Folded(acc, 0, 0.0)


class WholeTrajectory:
    """`trajectory` granularity: keep the turns, one gradient of the whole trajectory on close."""

    def __init__(self, score_fn, logprob_fn, add, pad_id: int):
        self.score_fn = score_fn
        self.logprob_fn = logprob_fn
        self._add = add
        self.pad_id = int(pad_id)

    def fold(self, policy, acc, traj: OpenTrajectory, payload) -> tuple[OpenTrajectory, Folded]:
        del policy
        traj, _, _, _ = extend(traj, payload)
        return traj, Folded(acc, 0, 0.0)  # tokens and Â are counted when the gradient runs

    def close(self, policy, acc, traj: OpenTrajectory) -> Folded:
        if not traj.scored.any():
            return Folded(acc, 0, 0.0)
        tokens, mask, teacher_lp = buckets.pack_sequences(
            [traj.seen], [traj.scored], [traj.teacher_logprobs], pad_id=self.pad_id
        )
        routes = None if traj.routes is None else traj.routes[None]  # [1, S, M, K]
        # log π_s for Â from the same (replayed or recomputed) routing as the gradient's
        student_lp = self.logprob_fn(policy.params, tokens, policy.base_params, routes)
        # Â_t = −(log π_s − log π_T)(o_t): numbers from the learner's forward, no gradient.
        advantage = np.where(mask > 0, teacher_lp - student_lp, 0.0).astype(np.float32)
        h, n, gap = self.score_fn.score_and_gap(
            policy.params,
            tokens,
            mask,
            advantage,
            traj.engine_logprobs[None],  # one row, unpadded: aligned with `tokens`
            base_params=policy.base_params,
            routes=routes,
        )
        acc = self._add(acc, h, n, max(traj.folded, 1))
        return Folded(acc, n, float(-np.sum(advantage, dtype=np.float64)), gap)
