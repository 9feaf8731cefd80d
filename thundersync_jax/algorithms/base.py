"""What the training loop needs from an algorithm, and the per-batch state every one shares.

An `Algorithm` is a NamedTuple of functions (optax style): its config check, the services it
runs beside the student's engines (OPD's teacher), how an episode becomes learner work
(`schedule.episodes.EpisodeWork`), and a factory for its `BatchLearner`: the learner pass
over a chunk as pure functions of an immutable per-batch state,

    state = learner.init(params, version, base_params, carry=carry)
    state = learner.process(state, chunk)          # for every chunk the planner hands out
    state = learner.close_groups(state, failed)    # groups that lost members for good
    grads = learner.finalize(state)                # ∇L, shaped like the trainable params
    learner.metrics(state)                         # the step's algorithm metrics
    carry = learner.carry(state)                   # what the next batch's init needs

The loop never reads a learner attribute back; everything a step reports comes from the
state it threaded through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from thundersync_jax.rollout.staleness import StalePolicyError, check_version


class BatchPolicy(NamedTuple):
    """The policy a batch is trained at (fixed for the batch).

    Attributes:
      params: the trainable params (full params, or LoRA adapters).
      base_params: the frozen full params under LoRA adapters, else None.
      version: the policy version of `params` (= the train state's step).
      enforce_version: refuse items sampled by another version (every schedule but async).
    """

    params: Any
    base_params: Any
    version: int
    enforce_version: bool


class MemberEnd(NamedTuple):
    """Payload of an item that only closes a member (OPD): its reward and verifier failure.

    Attributes:
      reward: the episode's reward.
      verifier_failure: "reason: error" when a failed verifier set the reward, else None.
      turns: turn items the member emitted (the learner closes its trajectory once all are
        in; the planner may hand this item out before them), or None: close at batch end.
    """

    reward: float
    verifier_failure: str | None
    turns: int | None = None


class MemberLost(NamedTuple):
    """Payload of an item queued before a `MemberFailed` (OPD): the member's turns so far.

    Its scored turns still count (as in the one-shot gradient of what arrived); the learner
    closes its trajectory (sweeps and frees its cache) once those `turns` items are in.
    """

    turns: int


def verifier_failure(traj) -> str | None:
    """ "reason: error" when the trajectory's reward came from a verifier that failed."""
    verdict = getattr(traj, "verifier", None)
    if verdict is None or verdict.error is None:
        return None
    return f"{verdict.reason}: {verdict.error}"


def item_lag(policy: BatchPolicy, versions: Iterable[int], what: str) -> int:
    """Learner version − the sampling version; refuses any lag if versions are enforced.

    Every schedule samples an item with one policy (async finishes the next batch's episodes
    before a weight swap), so an item that mixes versions is an error in any schedule.
    """
    versions = [int(v) for v in versions]
    if len(set(versions)) > 1:
        raise StalePolicyError(
            f"{what} mixes policy versions {sorted(set(versions))}: a weight load happened "
            "in the middle of its episode"
        )
    if policy.enforce_version:
        for v in versions:
            check_version(v, policy.version, what=what)
    return max((policy.version - v for v in versions), default=0)


class BatchLearner(NamedTuple):
    """One batch's learner work as pure functions of an immutable state (see module doc).

    Attributes:
      init: (params, version, base_params=None, enforce_version=True, carry=None) -> state.
      process: (state, chunk) -> state; returns once the chunk's work is done.
      close_groups: (state, groups) -> state.
      finalize: state -> ∇L (float32, shaped like the trainable params).
      metrics: state -> {metric: value} of the batch.
      compiles: () -> compilations of this learner's jitted functions so far.
      accumulator_state: state -> the accumulator's arrays (for `accum_bytes_peak`).
      kept_bytes_peak: state -> the batch's peak device bytes kept beside the accumulator
        (OPD: open trajectories' KV caches and cotangent buffers), added to `accum_bytes_peak`.
      carry: state -> a small host object the next batch's `init(carry=...)` takes, or None
        (OPD `auto`: the granularity chooser's timings and trace; GRPO: None). Never device
        arrays of the batch: the state (and its accumulator) must not outlive its step.
    """

    init: Callable
    process: Callable
    close_groups: Callable
    finalize: Callable
    metrics: Callable
    compiles: Callable[[], int]
    accumulator_state: Callable
    kept_bytes_peak: Callable = lambda state: 0
    carry: Callable = lambda state: None


class LearnerSetup(NamedTuple):
    """What an algorithm builds its learner from.

    Attributes:
      config: the run config.
      graphdef: the policy's model structure (`nnx.split(model, nnx.Param)[0]`).
      reference_params: the frozen warm start's full params (KL reference, LoRA base).
      lora: whether the trainable params are LoRA adapters.
      pad_id: the tokenizer's padding id.
      grad_shardings: NamedShardings of the trainable params (score gradients land there).
      rows: NamedSharding of chunk rows ([B, T] split over the mesh's "fsdp").
    """

    config: Any
    graphdef: Any
    reference_params: Any
    lora: bool
    pad_id: int
    grad_shardings: Any = None
    rows: Any = None


class Algorithm(NamedTuple):
    """An algorithm behind the one training loop.

    Attributes:
      name: the `rl.algorithm` value.
      check_config: config -> None; raises ConfigError naming a bad value.
      make_learner: LearnerSetup -> BatchLearner.
      start_services: (config, student_model_cfg, examples, workdir) -> a service with
        `close()` that runs beside the engines (OPD's teacher), or None; `examples()` gives
        the task family's demonstrations.
      episode_work: (services, timeline) -> `schedule.episodes.EpisodeWork`.
      max_chunk_tokens: config -> the token budget of one learner chunk.
    """

    name: str
    check_config: Callable
    make_learner: Callable
    start_services: Callable
    episode_work: Callable
    max_chunk_tokens: Callable
