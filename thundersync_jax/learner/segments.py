"""Trajectories as segments over the learner's own KV cache: per-turn gradients at linear cost.

DESIGN §2 ("Segments: linear cost"). Re-running the whole prefix for every scored turn makes a
trajectory of n turns cost ≈ (n+1)/2 one-shot gradients. Here each open trajectory keeps the
keys/values its own forward computed at θ; a new segment (a turn's observation + response)
runs forward over its new tokens only, against that cache, and

* its *direct* gradient (loss masked to the segment; cached K/V held fixed as inputs) is
  available at once, with the student log-probs of the same forward (for OPD's Â);
* its cotangents for the cached K/V are added into a per-trajectory buffer.

Reverse mode is linear in the output cotangent, so when the trajectory closes one reverse
sweep, newest segment first, pushes each segment's buffered K/V cotangent back through it
(vjp of its forward; the sweep step also adds the cotangent it yields for the earlier cache).
Direct parts plus the sweep equal the one-shot gradient of the whole trajectory; every segment
is forwarded at most twice and backpropagated at most twice, whatever the turn count. The sweep
merges consecutive segments into blocks up to the largest segment bucket (`_sweep_blocks`), so
it runs as a few long calls even when the turns are short.

Token bookkeeping matches `chunks.py`: the one-shot forward reads tokens[:-1] and scores
tokens[1:]. A trajectory therefore forwards its tokens one behind what it has seen: the latest
token is `pending` until the next segment (or never, if the trajectory ends there).

Shapes are padded to buckets (segment length, cache capacity) so compilations stay bounded;
padded keys are masked out exactly (their attention weight is exactly 0).

On the learner mesh (`mesh=`, `grad_shardings=`) the caches, segment inputs and gradients have
fixed shardings (`segment_layout.py`): KV heads over "tp", gradients laid out like the params.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax.learner import buckets, chunks, segment_layout, segment_programs
from thundersync_jax.learner.segment_state import Segment, SegmentResult, Trajectory
from thundersync_jax.models.qwen3 import Qwen3Config


class SegmentFns:
    """Jitted segment passes for one model structure; see `make_segment_fns`.

    Attributes:
      seg_buckets: padded segment lengths.
      cache_buckets: padded cache capacities.
      layout: where caches, inputs and gradients live (`segment_layout.py`).
      programs: the jitted passes (`segment_programs.Programs`), with `compiles` counters.
    """

    def __init__(
        self,
        graphdef: Any,
        cfg: Qwen3Config,
        seg_buckets: Sequence[int],
        cache_buckets: Sequence[int],
        remat: bool,
        lora_adapters: bool,
        temperature: float,
        cache_dtype: Any,
        pad_id: int,
        tis_cap: float = 0.0,
        mesh: Any = None,
        grad_shardings: Any = None,
    ):
        self.cfg = cfg
        self.layout = segment_layout.segment_layout(cfg, mesh, grad_shardings)
        self.seg_buckets = buckets.validate_buckets(seg_buckets)
        self.cache_buckets = buckets.validate_buckets(cache_buckets)
        self.cache_dtype = jnp.dtype(cache_dtype)
        self.pad_id = int(pad_id)
        self.lora = bool(lora_adapters)
        self.programs = segment_programs.Programs(
            graphdef,
            bool(remat),
            self.lora,
            chunks.check_temperature(temperature),
            tis_cap,
            self.layout,
        )

    @property
    def compiles(self) -> int:
        return self.programs.compiles

    # ---- state ----------------------------------------------------------------------------

    def open(self, capacity: int | None = None) -> Trajectory:
        """An empty trajectory whose cache holds `capacity` tokens (grown on demand)."""
        slots = buckets.bucket_length(max(capacity or 1, 2), self.cache_buckets)
        c = self.cfg
        shape = (c.num_hidden_layers, 1, slots, c.num_key_value_heads, c.head_dim)
        return Trajectory(
            k=self._zeros(shape, self.cache_dtype),
            v=self._zeros(shape, self.cache_dtype),
            dk=self._zeros(shape, jnp.float32),
            dv=self._zeros(shape, jnp.float32),
            length=0,
            pending=-1,
            segments=(),
        )

    def fork(self, prefix: Trajectory) -> Trajectory:
        """A new trajectory continuing `prefix` (e.g. a group member after its shared prompt).

        The keys/values are copied (the passes update caches in place), the cotangent buffers
        start at zero, and the prefix's segments are marked shared: `close` leaves them to
        the prefix's owner.
        """
        return prefix._replace(
            k=self._on_cache(jnp.copy(prefix.k)),
            v=self._on_cache(jnp.copy(prefix.v)),
            dk=self._zeros(prefix.dk.shape, prefix.dk.dtype),
            dv=self._zeros(prefix.dv.shape, prefix.dv.dtype),
            shared=len(prefix.segments),
        )

    def _zeros(self, shape, dtype) -> jax.Array:
        return jnp.zeros(shape, dtype, device=self.layout.cache)

    def _on_cache(self, x: jax.Array) -> jax.Array:
        """`x` laid out as a cache (eager ops such as pad or copy may not keep the layout)."""
        return self.layout.place(x, self.layout.cache)

    def _grown(self, traj: Trajectory, needed: int) -> Trajectory:
        if needed <= traj.capacity:
            return traj
        slots = buckets.bucket_length(needed, self.cache_buckets)
        pad = ((0, 0), (0, 0), (0, slots - traj.capacity), (0, 0), (0, 0))
        return traj._replace(
            k=self._on_cache(jnp.pad(traj.k, pad)),
            v=self._on_cache(jnp.pad(traj.v, pad)),
            dk=self._on_cache(jnp.pad(traj.dk, pad)),
            dv=self._on_cache(jnp.pad(traj.dv, pad)),
        )

    def _past_slots(self, start: int) -> int:
        """Leading cache slots a segment starting at `start` attends to (a cache bucket)."""
        return 0 if start == 0 else buckets.bucket_length(start, self.cache_buckets)

    def _padded(self, start: int, inputs: np.ndarray, targets: np.ndarray):
        """A segment padded to its length bucket (padding is never attended to or scored)."""
        t_pad = buckets.bucket_length(max(len(inputs), 2), self.seg_buckets)
        pad = (0, t_pad - len(inputs))
        seg = segment_programs.SegmentInputs(
            start=np.int32(start),  # host scalar: no eager device op per call
            inputs=np.pad(inputs, pad, constant_values=self.pad_id),
            targets=np.pad(targets, pad, constant_values=self.pad_id),
            real=np.pad(np.ones(len(inputs), bool), pad),
        )
        return self.layout.place(seg, self.layout.replicated)  # one transfer on a mesh

    # ---- passes ---------------------------------------------------------------------------

    def score(
        self,
        params: Any,
        traj: Trajectory,
        new_tokens: Sequence[int] | np.ndarray,
        loss_mask: Sequence[float] | np.ndarray | None = None,
        *,
        teacher_logprobs: Sequence[float] | np.ndarray | None = None,
        token_weights: Sequence[float] | np.ndarray | None = None,
        engine_logprobs: Sequence[float] | np.ndarray | None = None,
        base_params: Any = None,
    ) -> tuple[Trajectory, SegmentResult]:
        """Appends `new_tokens` to the trajectory: forward against its cache, direct gradient.

        Args:
          params: trainable params (LoRA adapters with `lora=True`).
          traj: the trajectory's state (from `open`, `fork` or an earlier `score`).
          new_tokens: int [n] tokens that follow the trajectory so far.
          loss_mask: [n] 0/1, 1 = score this token given everything before it. None = all 0
            (a prompt or observation: forward only, no gradient). The very first token of a
            trajectory has no context and must not be scored.
          teacher_logprobs: [n] log π_T of the scored tokens: OPD, weights Â_t = log π_T −
            log π_s from this forward (no gradient through Â).
          token_weights: [n] per-token weights instead (GRPO: ones, or a detached importance
            weight); None = ones. Not together with teacher_logprobs.
          engine_logprobs: [n] the sampling engine's log-probs of the tokens (NaN where it gave
            none; None = none at all): the gap sums, and the `tis_cap` weight (`SegmentFns`).
          base_params: frozen model params, with `lora=True`.

        Returns:
          (new state, `SegmentResult`). The input `traj` must not be used again (its cache
          buffers are donated to the update).
        """
        if self.lora and base_params is None:
            raise ValueError("a LoRA segment pass needs base_params (the frozen model)")
        new, mask, side, engine = _checked(
            new_tokens, loss_mask, teacher_logprobs, token_weights, engine_logprobs
        )
        n = len(new)
        inputs, targets, mask, side, engine = _shifted(traj.pending, new, mask, side, engine)
        pending = int(new[-1]) if n else traj.pending
        offset = n - len(targets)  # 1 on the trajectory's first call (token 0 unscored)
        logp_out = np.zeros(n, np.float32)
        weights_out = np.zeros(n, np.float32)
        if not len(inputs):
            return traj._replace(pending=pending), SegmentResult(None, 0, logp_out, weights_out)
        traj = self._grown(traj, traj.length + len(inputs))
        seg = self._padded(traj.length, inputs, targets)
        pad = (0, len(seg.inputs) - len(inputs))
        gap = None
        if not mask.any():
            k, v = self.programs.forward(
                params, base_params, traj.k, traj.v, seg, past_slots=self._past_slots(traj.length)
            )
            grad, dk, dv = None, traj.dk, traj.dv
        else:
            distill = teacher_logprobs is not None
            per_token = (
                np.pad(mask, pad),
                np.pad(side, pad),
                np.pad(engine, pad, constant_values=np.nan),
            )
            grad, k, v, dk, dv, logp, w, gap = self.programs.direct(
                params,
                base_params,
                (traj.k, traj.v, traj.dk, traj.dv),
                seg,
                *self.layout.place(per_token, self.layout.replicated),
                distill=distill,
                past_slots=self._past_slots(traj.length),
            )
            logp_out[offset:] = np.asarray(logp)[: len(inputs)]
            weights_out[offset:] = np.asarray(w)[: len(inputs)]
        segment = Segment(traj.length, inputs)
        traj = Trajectory(
            k, v, dk, dv, traj.length + len(inputs), pending, (*traj.segments, segment), traj.shared
        )
        return traj, SegmentResult(grad, int(mask.sum()), logp_out, weights_out, gap)

    def close(
        self, params: Any, traj: Trajectory, *, base_params: Any = None, consumed: bool = False
    ) -> tuple[Any, Trajectory]:
        """The deferred part of the trajectory's gradient: one reverse sweep over its segments.

        Newest first, each segment's buffered K/V cotangent goes back through its forward (the
        vjp also adds the cotangent for the earlier cache into the buffer). Shared leading
        segments are left to their owner.

        Args:
          consumed: False (a trajectory of its own): the newest segment's keys have no
            consumers, so it is skipped. True: a forked prefix (a group's prompt) whose buffer
            the caller filled with its members' cotangents; every segment is swept.

        Returns:
          (deferred gradient: float32 like the trainable params, or None when there was
          nothing to sweep; the final state, whose `dk`/`dv` on a shared prefix's slots hold
          this trajectory's cotangents for the shared keys/values).
        """
        if self.lora and base_params is None:
            raise ValueError("a LoRA segment pass needs base_params (the frozen model)")
        owned = traj.segments[traj.shared :]
        sweep = owned if consumed else owned[:-1]
        total = self.programs.zeros(params) if sweep else None
        dk, dv = traj.dk, traj.dv
        for segment in _sweep_blocks(sweep, self.seg_buckets[-1]):
            seg = self._padded(segment.start, segment.inputs, np.zeros_like(segment.inputs))
            total, dk, dv = self.programs.sweep(
                params,
                base_params,
                (traj.k, traj.v, dk, dv),
                total,
                seg,
                past_slots=self._past_slots(segment.start),
            )
        return total, traj._replace(dk=dk, dv=dv)


def _sweep_blocks(sweep: Sequence[Segment], max_tokens: int) -> list[Segment]:
    """Consecutive segments merged into blocks of at most `max_tokens`, newest block first.

    Sweeping a block at once is exact too: its vjp pushes the buffered cotangents of all its
    keys/values back through the block's forward, and the dependencies inside the block (a
    later segment reading an earlier one's keys) are differentiated by that same vjp, which
    is what sweeping the later segment would have added to the earlier one's buffer. Direct
    passes' contributions are already in the buffer and are not recomputed (the block's
    loss cotangent is zero). Fewer, longer calls run at the per-token cost of long chunks.
    """
    blocks: list[list[Segment]] = []
    for segment in reversed(sweep):
        size = sum(len(s.inputs) for s in blocks[-1]) if blocks else max_tokens
        if size + len(segment.inputs) > max_tokens:
            blocks.append([])
        blocks[-1].insert(0, segment)
    return [Segment(b[0].start, np.concatenate([s.inputs for s in b])) for b in blocks]


def _checked(new_tokens, loss_mask, teacher_logprobs, token_weights, engine_logprobs):
    """(tokens int32 [n], mask, teacher log-probs or weights, engine log-probs: float32 [n]).

    No engine log-probs: all NaN (none given).
    """
    if teacher_logprobs is not None and token_weights is not None:
        raise ValueError("pass teacher_logprobs (OPD) or token_weights (GRPO), not both")
    new = np.asarray(new_tokens, np.int32).reshape(-1)
    n = len(new)
    mask = np.zeros(n, np.float32) if loss_mask is None else np.asarray(loss_mask, np.float32)
    if mask.shape != (n,) or not np.all((mask == 0) | (mask == 1)):
        raise ValueError(f"loss_mask must be {n} values of 0/1, got shape {mask.shape}")
    side = teacher_logprobs if teacher_logprobs is not None else token_weights
    side = np.ones(n, np.float32) if side is None else np.asarray(side, np.float32)
    if side.shape != (n,):
        raise ValueError(f"teacher_logprobs/token_weights need {n} values, got {side.shape}")
    engine = np.full(n, np.nan) if engine_logprobs is None else np.asarray(engine_logprobs)
    if engine.shape != (n,):
        raise ValueError(f"engine_logprobs need {n} values, got {engine.shape}")
    return new, mask, side, engine.astype(np.float32)


def make_segment_fns(
    graphdef: Any,
    cfg: Qwen3Config,
    seg_buckets: Sequence[int] = (16, 32, 64, 128, 256, 512, 1024, 2048),
    cache_buckets: Sequence[int] = (256, 512, 1024, 2048, 4096),
    remat: bool = False,
    *,
    lora: bool = False,
    temperature: float = 1.0,
    cache_dtype: Any = jnp.float32,
    pad_id: int = 0,
    tis_cap: float = 0.0,
    mesh: Any = None,
    grad_shardings: Any = None,
) -> SegmentFns:
    """Builds the segment passes for a Qwen3 structure (`nnx.split(model, nnx.Param)[0]`).

    Args:
      graphdef: the model structure.
      cfg: its config (cache shapes).
      seg_buckets: padded segment lengths; a longer segment raises ValueError.
      cache_buckets: padded cache capacities; a longer trajectory raises ValueError.
      remat: rematerialize each decoder layer in the backward passes.
      lora: trainable params are LoRA adapters (pass base_params to every call).
      temperature: the rollout sampling temperature (log π = log_softmax(logits / T)).
      cache_dtype: storage dtype of the cached keys/values (the model's activation dtype).
      pad_id: token written into padding (never attended to, never scored).
      tis_cap: > 0 weights each scored token by min(π_learner / π_engine, tis_cap) (detached;
        the engine log-probs given to `score`); 0 = off.
      mesh: the learner mesh ("fsdp", "tp"); None = one device. With it, caches, inputs and
        gradients get fixed shardings (`segment_layout.py`).
      grad_shardings: with a mesh, the trainable params' NamedShardings.
    """
    if not isinstance(cfg, Qwen3Config):
        raise ValueError(
            f"segments (OPD at turn granularity) run dense Qwen3/Qwen2 policies only; "
            f"{cfg.model_type} is not one: use rl.opd_granularity='trajectory'"
        )
    passes = (seg_buckets, cache_buckets, remat, lora, temperature, cache_dtype, pad_id, tis_cap)
    return SegmentFns(graphdef, cfg, *passes, mesh=mesh, grad_shardings=grad_shardings)


def _shifted(pending: int, new, mask, side, engine):
    """(inputs, targets, mask, side, engine): each target scored given the token before it.

    `pending` is the trajectory's last token not yet fed as an input (-1 before its first
    token: then the first new token has nothing before it and is not scored).
    """
    if pending < 0:
        if len(new) and mask[0]:
            raise ValueError("the first token of a trajectory has no context to score it")
        return new[:-1], new[1:], mask[1:], side[1:], engine[1:]
    return np.concatenate([[pending], new[:-1]]).astype(np.int32), new, mask, side, engine
