"""The GRPO trainer: rollouts in engine processes, streamed learner work, one step per batch.

    trainer.train(config, workdir)

Per step: every episode of the batch starts at once on the engines (policy
version v); each finished trajectory enters the learner's queue; the planner
(schedule sync | group | stream | async) decides when its score gradient runs;
the accumulator folds it in; when the batch closes, one optimizer step, then
the new weights are published (Orbax snapshot in shared memory) and every
engine acknowledges version v+1 before the next batch starts. Checkpoints,
metrics, timelines and arrival traces land in the workdir; rerunning the same
command resumes from the newest whole checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from thundersync_jax import accumulators, metrics
from thundersync_jax.envs import agent_loop
from thundersync_jax.learner import chunks, export, model_state, placement
from thundersync_jax.learner.checkpoint import Checkpointer
from thundersync_jax.learner.train_state import log_skipped_update, make_apply_update
from thundersync_jax.models import tokenizer
from thundersync_jax.schedule import components as setup
from thundersync_jax.schedule import lora_policy, regularizers, rollouts
from thundersync_jax.schedule.config_check import check_config
from thundersync_jax.schedule.grpo_learner import GrpoLearner
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.planner import Planner

log = logging.getLogger(__name__)


def _max_chunk_tokens(config) -> int:
    # One chunk should fill the largest bucket's worth of rows, not more.
    return int(config.rollout.max_traj_tokens) * max(1, int(config.rl.group_size))


def export_final(graphdef, params, workdir: str, tok) -> str:
    """DIR/final: weights, config.json, generation_config.json and the tokenizer."""
    return export.export_policy(graphdef, params, os.path.join(workdir, "final"), tok)


@dataclasses.dataclass
class _Run:
    """What every step needs: the fixed pieces of one training run."""

    config: Any
    workdir: str
    tasks: list
    tok: Any
    fleet: Any
    learner: GrpoLearner
    limits: agent_loop.LoopLimits
    apply_update: Any
    policy: lora_policy.Policy

    def publish(self, trainable, version: int) -> None:
        """Sends the policy for `trainable` to every engine (merged or adapters under LoRA)."""
        if not self.policy.is_lora:
            self.fleet.publish(trainable, version)
            return
        tree = self.policy.publishable(trainable)
        kind = self.policy.publish_kind
        self.fleet.manager.publish(tree, int(version), self.fleet.root, kind=kind)


def train(config, workdir: str) -> dict:
    """Runs (or resumes) training; returns the last step's metrics."""
    placement.apply_learner_env(config)  # before JAX starts: its GPUs, no 75% grab
    check_config(config)
    lora_policy.check_lora_config(config)
    reg_coefs = regularizers.term_coefficients(config.rl)  # also rejects a bad kl_estimator
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    setup.configure_logging(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))

    tok = tokenizer.for_run(config)
    tasks = setup.build_tasks(config, workdir)
    ckpt = Checkpointer(workdir, keep=int(config.checkpoint.keep))
    # Params, LoRA adapters and optimizer state are made (or restored) on the learner mesh.
    # Under LoRA the state holds only the adapters; `params` (the warm start) stays frozen.
    built = model_state.build_learner_model(
        config,
        warm_model=setup.warm_start(config, tasks, tok, workdir),
        make_policy=lambda p: lora_policy.make_policy(config, p),
        checkpointer=ckpt,
    )
    graphdef, params, policy = built.graphdef, built.params, built.policy
    optimizer, state = built.optimizer, built.state
    if built.resumed:
        log.info("resumed from checkpoint at step %d", int(state.step))
    first_step = int(state.step)
    setup.trim_metrics(workdir, first_step)
    if first_step >= config.num_steps:
        path = export_final(graphdef, policy.full_params(state.params), workdir, tok)
        log.info(
            "nothing to train (step %d of %d); final policy at %s",
            first_step,
            config.num_steps,
            path,
        )
        ckpt.close()
        return {}

    rl = config.rl
    acc = accumulators.grpo(
        num_groups=rl.num_groups,
        group_size=rl.group_size,
        advantage=rl.advantage,
        loss_agg=rl.loss_agg,
        eps=rl.eps,
        std_ddof=rl.std_ddof,
        max_len=rl.max_len or config.rollout.max_traj_tokens,
        max_open_groups=rl.max_open_groups or None,
    )
    score_fn = chunks.make_score_grad_fn(
        graphdef,
        tuple(config.learner.seq_buckets),
        remat=bool(config.model.remat),
        lora=policy.is_lora,
        pad_id=tok.pad_id,
        temperature=float(config.rollout.temperature),  # log-probs of what the engine sampled
        out_shardings=built.state_shardings.params,
        rows=built.rows,
    )
    reg_fn = None
    if reg_coefs:
        # KL / entropy add into the global tally; the reference is the frozen warm start.
        acc = regularizers.combined_accumulator(acc, reg_coefs)
        reg_fn = regularizers.RegularizerGradFn(
            graphdef,
            tuple(reg_coefs),
            # The update donates the state, whose params are `params` without LoRA: copy.
            reference_params=params if policy.is_lora else jax.tree.map(jnp.copy, params),
            kl_estimator=rl.kl_estimator,
            seq_buckets=tuple(config.learner.seq_buckets),
            lora_adapters=policy.is_lora,
            pad_id=tok.pad_id,
            temperature=float(config.rollout.temperature),
        )
    writer = metrics.MetricsWriter(workdir, tensorboard=bool(config.metrics.tensorboard))
    progress = metrics.StepProgress(
        config.num_steps, desc=f"grpo/{config.schedule}", initial=first_step
    )
    fleet = setup.EngineFleet(config, workdir, tok, built.model_cfg)
    run = _Run(
        config=config,
        workdir=workdir,
        tasks=tasks,
        tok=tok,
        fleet=fleet,
        learner=GrpoLearner(
            acc,
            score_fn,
            tok.pad_id,
            enforce_version=config.schedule != "async",
            regularizer_fn=reg_fn,
        ),
        limits=agent_loop.LoopLimits.from_config(config.rollout),
        apply_update=make_apply_update(optimizer, skip_zero_grad=bool(config.optim.skip_zero_grad)),
        policy=policy,
    )
    last: dict = {}
    try:
        fleet.drop_versions_from(first_step)
        run.publish(state.params, first_step)
        pending = None  # async: the next batch's rollouts, already running
        for step in range(first_step, config.num_steps):
            state, pending, last = _train_step(run, step, state, pending)
            writer.write(step, last)
            progress.update(last)
            every = int(config.checkpoint.every)
            if every and ((step + 1) % every == 0 or step + 1 == config.num_steps):
                ckpt.save(state)
        if pending is not None:
            pending["thread"].join()
        export_final(graphdef, policy.full_params(state.params), workdir, tok)
    finally:
        progress.close()
        writer.close()
        fleet.close()
        ckpt.close()
    return last


def _launch(run: _Run, step: int, timeline: metrics.Timeline) -> dict:
    """Starts every episode of `step`; returns its arrival queue, thread and timeline."""
    config, rl = run.config, run.config.rl
    q: queue.Queue = queue.Queue()
    thread = rollouts.launch_batch(
        step=step,
        seed=int(config.seed),
        group_size=rl.group_size,
        num_groups=rl.num_groups,
        make_env=setup.env_factory(config, run.tasks, run.workdir, step),
        sampler=run.fleet.sampler,
        tok=run.tok,
        limits=run.limits,
        out=q,
        timeline=timeline,
        max_concurrency=int(config.rollout.max_batch),
    )
    return {"queue": q, "thread": thread, "timeline": timeline}


def _train_step(run: _Run, step: int, state, pending):
    """One batch: rollouts, streamed learner work, optimizer step, publication.

    Returns (new state, the async pipeline's next batch or None, the step's metrics).
    """
    config, rl = run.config, run.config.rl
    version = int(state.step)
    if config.schedule == "async":
        # Rollouts of step n+1 run on policy n while the learner trains step n.
        current = pending or _launch(run, step, metrics.Timeline(schedule="async"))
        nxt = None
        if step + 1 < config.num_steps:
            nxt = _launch(run, step + 1, metrics.Timeline(schedule="async"))
    else:
        current, nxt = _launch(run, step, metrics.Timeline(schedule=config.schedule)), None
    timeline = current["timeline"]

    planner = Planner(
        config.schedule,
        rl.num_groups,
        rl.group_size,
        _max_chunk_tokens(config),
        rl.max_open_groups or None,
    )
    learner = run.learner
    learner.begin(state.params, version, base_params=run.policy.base)
    stats = run_learner_batch(
        planner,
        current["queue"],
        learner.process,
        on_chunk=lambda c, s, e: timeline.record(
            metrics.CHUNK,
            s,
            e,
            group=c[0].group,
            ids=[it.item_id for it in c],
            tokens=sum(it.num_tokens for it in c),
        ),
        timeout_s=float(config.rollout.request_timeout_s) * config.rollout.max_turns,
    )
    current["thread"].join()

    with timeline.span(metrics.OPT):
        learner.close_short_groups(stats.failed_groups)
        grads = learner.finalize()
        new_state, applied, grad_norm = run.apply_update(state, grads)
        jax.block_until_ready(new_state.params)
    if not bool(applied):
        log_skipped_update(log, step, grad_norm)
    for failure in learner.verifier_failures:
        log.warning("step %d: verifier failed for %s", step, failure)
    with timeline.span(metrics.PUBLISH):
        run.publish(new_state.params, int(new_state.step))

    rewards = sorted(learner.rewards)  # sorted: the mean must not depend on arrival order
    out = metrics.step_metrics(timeline)
    out.update(
        step=step,
        max_policy_lag=int(learner.max_lag),
        open_groups_peak=int(planner.open_groups_peak),
        accum_bytes_peak=int(setup.tree_bytes(learner.state)),
        reward_mean=float(np.mean(rewards)) if rewards else 0.0,
        tokens=int(learner.tokens),
        compiles=int(chunks.total_compiles()) + _regularizer_compiles(learner),
        grad_norm=float(grad_norm),
        update_skipped=not bool(applied),
        rollout_failures=len(stats.failures),
        verifier_failures=setup.verifier_failure_count(),
    )
    setup.save_step_artifacts(config, run.workdir, step, timeline)
    return new_state, nxt, out


def _regularizer_compiles(learner: GrpoLearner) -> int:
    fn = learner.regularizer_fn
    return 0 if fn is None else int(fn.compiles)
