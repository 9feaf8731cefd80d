"""On-policy distillation learner work for one batch: scored turns folded into `opd()`.

A work item is one assistant turn: the trajectory's tokens up to the turn's end, the loss
mask of that turn alone, and the teacher's log-probs of its tokens. For a chunk of such turns
the learner

1. runs its own forward for the student's log-probs log π_s(o_t) (DESIGN §2: log-probs from the
   learner, never from the sampler), and forms Â_t = −(log π_s − log π_T)(o_t) as plain numbers,
   so no gradient flows through Â;
2. takes h = Σ_t Â_t ∇ log π_s(o_t) over the turn's tokens with the score-gradient chunk
   function (forward over the whole prefix, loss masked to the turn);
3. adds h and the turn's token count into the accumulator, whose finalize is −(1/N) Σ h.

Because attention is causal, the per-turn gradients of a trajectory sum to its
full-trajectory gradient, so streaming turn by turn gives the batch-synchronous update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax import losses
from thundersync_jax.learner import buckets, chunks
from thundersync_jax.learner.chunks import ScoreGradFn
from thundersync_jax.models import lora
from thundersync_jax.rollout.staleness import check_version
from thundersync_jax.schedule.planner import WorkItem


@dataclasses.dataclass(frozen=True)
class TurnPayload:
    """What the learner needs for one scored turn.

    Attributes:
      tokens: int32 [L], the trajectory up to the turn's last sampled token.
      loss_mask: bool [L], True on this turn's sampled tokens only.
      teacher_logprobs: float32 [L], log π_T of each masked token (0 elsewhere).
      policy_version: version of the student weights that sampled the turn.
      turn: the turn's index in its episode.
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    teacher_logprobs: np.ndarray
    policy_version: int
    turn: int

    @classmethod
    def from_turn(
        cls,
        tokens: Sequence[int],
        turn_start: int,
        teacher_logprobs: Sequence[float],
        policy_version: int,
        turn: int,
    ) -> TurnPayload:
        """From the trajectory so far and the teacher's log-probs of the turn at `turn_start`."""
        t_lp = np.asarray(teacher_logprobs, np.float32).reshape(-1)
        end = turn_start + len(t_lp)
        prefix = np.asarray(tokens, np.int32)[:end]
        if len(prefix) != end or turn_start < 1 or not len(t_lp):
            raise ValueError(
                f"turn at {turn_start} with {len(t_lp)} scored tokens does not fit a "
                f"{len(tokens)}-token trajectory (need 1 <= start, start + n <= length, n >= 1)"
            )
        mask = np.zeros(end, bool)
        mask[turn_start:end] = True
        full_lp = np.zeros(end, np.float32)
        full_lp[turn_start:end] = t_lp
        return cls(prefix, mask, full_lp, int(policy_version), int(turn))

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


class TokenLogprobFn:
    """Jitted student forward: [B, T] log π(tokens[:, t] | tokens[:, <t]) (0 at t = 0).

    Shares the score-gradient function's model structure, LoRA mode, padding token and
    sequence buckets, and pads exactly as it does, so the log-probs are those of the
    forward the gradient is taken through.
    """

    def __init__(self, score_fn: ScoreGradFn):
        self.score_fn = score_fn
        self.compiles = 0
        self._jitted = jax.jit(self._forward)

    def _forward(self, params, base_params, tokens):
        self.compiles += 1  # runs once per trace
        full = lora.merge(base_params, params) if self.score_fn.lora else params
        model = nnx.merge(self.score_fn.graphdef, full)
        logits = chunks.tempered(model(tokens[:, :-1]), self.score_fn.temperature)
        logp = losses.token_logprobs(logits, tokens[:, 1:])  # [B, T-1]
        return jnp.pad(logp, ((0, 0), (1, 0)))

    def __call__(self, params: Any, tokens: np.ndarray, base_params: Any = None) -> np.ndarray:
        tokens = np.asarray(tokens, np.int32)
        chunk = buckets.pad_chunk(
            tokens,
            np.zeros(tokens.shape, np.float32),
            None,
            self.score_fn.seq_buckets,
            self.score_fn.pad_id,
        )
        logp = self._jitted(params, base_params, chunk.tokens)
        return np.asarray(logp)[: tokens.shape[0], : tokens.shape[1]]


class OpdLearner:
    """Folds scored turns of one batch into an `accumulators.opd()` accumulator.

    Args:
      acc: `accumulators.opd()` (token-mean: finalize = −(1/N) Σ h).
      score_fn: `learner.chunks.make_score_grad_fn(...)` for the student.
      pad_id: padding token id.
    """

    def __init__(self, acc, score_fn: ScoreGradFn, pad_id: int):
        self.acc = acc
        self.score_fn = score_fn
        self.logprob_fn = TokenLogprobFn(score_fn)
        self.pad_id = int(pad_id)
        self._add = jax.jit(acc.add_weighted, donate_argnums=0)
        self.state = None
        self.params = None
        self.base_params = None
        self.version = -1
        self.tokens = 0
        self.turns = 0
        self.reverse_kl_sum = 0.0

    def begin(self, params: Any, version: int, base_params: Any = None) -> None:
        """Starts a batch on `params` (student policy `version`)."""
        self.params, self.base_params, self.version = params, base_params, int(version)
        self.state = self.acc.init(params)
        self.tokens = 0
        self.turns = 0
        self.reverse_kl_sum = 0.0

    def process(self, chunk: list[WorkItem]) -> None:
        """The learner work of one planner chunk (items without payload only close members)."""
        turns = [it for it in chunk if it.payload is not None]
        if not turns:
            return
        for it in turns:
            check_version(it.payload.policy_version, self.version, what=f"turn {it.item_id}")
        payloads = [it.payload for it in turns]
        tokens, mask, teacher_lp = buckets.pack_sequences(
            [p.tokens for p in payloads],
            [p.loss_mask for p in payloads],
            [p.teacher_logprobs for p in payloads],
            pad_id=self.pad_id,
        )
        student_lp = self.logprob_fn(self.params, tokens, self.base_params)
        # Â_t = −(log π_s − log π_T)(o_t): numbers from the learner's forward, no gradient.
        advantage = np.where(mask > 0, teacher_lp - student_lp, 0.0).astype(np.float32)
        h, n = self.score_fn(self.params, tokens, mask, advantage, base_params=self.base_params)
        self.state = self._add(self.state, h, n, len(turns))
        self.tokens += n
        self.turns += len(turns)
        self.reverse_kl_sum += float(-np.sum(advantage, dtype=np.float64))

    def finalize(self) -> Any:
        """−(1/N) Σ h over the batch's turns: the OPD gradient, float32, shaped like params."""
        return self.acc.finalize(self.state)

    @property
    def reverse_kl(self) -> float:
        """Mean over scored tokens of (log π_s − log π_T)(o_t), o_t ~ π_s: a reverse-KL estimate."""
        return self.reverse_kl_sum / max(self.tokens, 1)

    @property
    def compiles(self) -> int:
        return self.logprob_fn.compiles
