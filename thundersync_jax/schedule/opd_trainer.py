"""The on-policy distillation trainer: student rollouts, teacher-scored turns, streamed updates.

    opd_trainer.train(config, workdir)     # config: rl.algorithm="opd", env.family="terminal"

Per step: every student episode of the batch starts at once on the student's engines (policy
version v). Each sampled turn goes to the teacher (its own engine process) while the turn's
tool call runs; once scored, it enters the learner's queue. The planner's schedule decides when
its gradient is taken — `sync` after every turn of the batch is in, `group` per completed
group, `stream` per turn as soon as it is scored — and the learner folds
h = Σ_t Â_t ∇ log π_s(o_t), Â_t = −(log π_s − log π_T)(o_t) into `accumulators.opd()`. When the
batch closes: finalize (−(1/N) Σ h, N = scored tokens), one optimizer step, publish, and every
engine acknowledges v+1 before the next batch. Metrics (DESIGN §6 names, plus `reverse_kl`,
the sampled-token estimate of KL(π_s ‖ π_T) at the policy of the step), checkpoints,
timelines and the final policy land in the workdir; rerunning resumes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import queue
from typing import Any

import jax
import numpy as np

from thundersync_jax import accumulators, metrics, teacher
from thundersync_jax.envs import agent_loop
from thundersync_jax.learner import chunks, model_state, placement, sft
from thundersync_jax.learner.checkpoint import Checkpointer
from thundersync_jax.learner.train_state import (
    log_skipped_update,
    make_apply_update,
)
from thundersync_jax.models import qwen3, tokenizer
from thundersync_jax.schedule import components, opd_rollouts, terminal_setup
from thundersync_jax.schedule.config_check import ConfigError, check_config
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.opd_learner import OpdLearner
from thundersync_jax.schedule.planner import Planner
from thundersync_jax.schedule.trainer import export_final

log = logging.getLogger(__name__)


def check_opd_config(config) -> None:
    """`check_config` plus what OPD needs; raises ConfigError naming the bad value."""
    check_config(config)
    if config.rl.algorithm != "opd":
        raise ConfigError(f"rl.algorithm={config.rl.algorithm!r}: the OPD trainer needs 'opd'")
    if config.env.family != "terminal":
        raise ConfigError(f"env.family={config.env.family!r}: the OPD trainer runs 'terminal'")
    if config.rl.loss_agg != "token-mean":
        # Per-turn items would get per-turn (not per-trajectory) weights under other modes.
        raise ConfigError(
            f"rl.loss_agg={config.rl.loss_agg!r}: OPD is −(1/N) Σ over scored tokens; use "
            "'token-mean'"
        )
    if config.get("teacher") is None:
        raise ConfigError(
            "the OPD config needs a `teacher` section (see configs/terminal_opd_cpu.py)"
        )
    if config.lora.enabled:
        raise ConfigError("lora.enabled=True is not supported by the OPD trainer yet; use False")
    if not config.teacher.checkpoint and config.teacher.sft_steps < 1:
        raise ConfigError(
            "teacher.checkpoint is empty and teacher.sft_steps < 1: give a teacher checkpoint "
            "or train the embedded teacher for >= 1 step"
        )


@dataclasses.dataclass
class _Run:
    """The fixed pieces of one OPD run."""

    config: Any
    workdir: str
    tasks: list
    tok: Any
    fleet: components.EngineFleet
    teacher: teacher.TeacherService
    learner: OpdLearner
    limits: agent_loop.LoopLimits
    apply_update: Any


def _warm_start(config, examples, tok, cache: str) -> qwen3.Qwen3 | None:
    """The student trained on the demonstrations, or None (checkpoint or random init, made
    on the learner mesh by `learner.model_state`)."""
    if model_state.warm_start_steps(config) == 0:
        return None
    result = sft.train_sft_from_config(config, examples, cache, name="student", progress=False)
    log.info("student warm start: %s (cache hit: %s)", result.path, result.cache_hit)
    return result.model


def _start_engines(config, workdir, tok, student_cfg, examples, cache):
    """Student engines and the teacher (trained, then in its process), side by side."""
    # Its own directory beside the student's snapshots (one teacher version, never replaced).
    tag = hashlib.sha1(workdir.encode()).hexdigest()[:8]
    teacher_root = os.path.join(
        config.rollout.snapshot_root, f"{os.path.basename(workdir)}-{tag}-teacher"
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fleet_f = pool.submit(components.EngineFleet, config, workdir, tok, student_cfg)
        try:
            service = teacher.start_teacher(
                config, student_cfg, lambda: examples, cache, teacher_root
            )
        except BaseException:
            with contextlib.suppress(Exception):  # keep the teacher's error, not the fleet's
                fleet_f.result().close()
            raise
        try:
            fleet = fleet_f.result()
        except BaseException:
            service.close()
            raise
    return fleet, service


def train(config, workdir: str) -> dict:
    """Runs (or resumes) OPD training; returns the last step's metrics."""
    placement.apply_learner_env(config)  # before JAX starts: its GPUs, no 75% grab
    check_opd_config(config)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    components.configure_logging(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))

    tok = tokenizer.for_run(config)
    tasks = terminal_setup.build_tasks(config)
    examples = terminal_setup.demonstrations(config, tasks, tok)
    cache = config.sft.cache_dir or workdir
    ckpt = Checkpointer(workdir, keep=int(config.checkpoint.keep))
    built = model_state.build_learner_model(
        config, warm_model=_warm_start(config, examples, tok, cache), checkpointer=ckpt
    )
    graphdef, optimizer, state = built.graphdef, built.optimizer, built.state
    if built.resumed:
        log.info("resumed from checkpoint at step %d", int(state.step))
    first_step = int(state.step)
    components.trim_metrics(workdir, first_step)
    if first_step >= config.num_steps:
        export_final(graphdef, state.params, workdir, tok)
        ckpt.close()
        return {}

    score_fn = chunks.make_score_grad_fn(
        graphdef,
        tuple(config.learner.seq_buckets),
        remat=bool(config.model.remat),
        pad_id=tok.pad_id,
        temperature=float(config.rollout.temperature),  # the student's sampling distribution
        out_shardings=built.state_shardings.params,
        rows=built.rows,
    )
    writer = metrics.MetricsWriter(workdir, tensorboard=bool(config.metrics.tensorboard))
    progress = metrics.StepProgress(
        config.num_steps, desc=f"opd/{config.schedule}", initial=first_step
    )
    fleet = service = None
    last: dict = {}
    try:
        fleet, service = _start_engines(config, workdir, tok, built.model_cfg, examples, cache)
        run = _Run(
            config=config,
            workdir=workdir,
            tasks=tasks,
            tok=tok,
            fleet=fleet,
            teacher=service,
            learner=OpdLearner(accumulators.opd(loss_agg="token-mean"), score_fn, tok.pad_id),
            limits=agent_loop.LoopLimits.from_config(config.rollout),
            apply_update=make_apply_update(
                optimizer, skip_zero_grad=bool(config.optim.skip_zero_grad)
            ),
        )
        fleet.drop_versions_from(first_step)
        fleet.publish(state.params, first_step)
        for step in range(first_step, config.num_steps):
            state, last = _train_step(run, step, state)
            writer.write(step, last)
            progress.update(last)
            every = int(config.checkpoint.every)
            if every and ((step + 1) % every == 0 or step + 1 == config.num_steps):
                ckpt.save(state)
        export_final(graphdef, state.params, workdir, tok)
    finally:
        progress.close()
        writer.close()
        if service is not None:
            service.close()
        if fleet is not None:
            fleet.close()
        ckpt.close()
    return last


def _max_chunk_tokens(config) -> int:
    # Turns of one group packed as rows: about one trajectory's worth of scored tokens.
    return int(config.rollout.max_new_tokens_per_turn) * int(config.rollout.max_turns)


def _train_step(run: _Run, step: int, state) -> tuple[Any, dict]:
    """One batch: student rollouts with teacher-scored turns, learner work, step, publish."""
    config, rl = run.config, run.config.rl
    timeline = metrics.Timeline(schedule=config.schedule)
    arrivals: queue.Queue = queue.Queue()
    thread = opd_rollouts.launch_opd_batch(
        step=step,
        seed=int(config.seed),
        num_groups=int(rl.num_groups),
        group_size=int(rl.group_size),
        make_env=terminal_setup.env_factory(config, run.tasks, step),
        sampler=run.fleet.sampler,
        tok=run.tok,
        limits=run.limits,
        scorer=run.teacher.scorer,
        out=arrivals,
        timeline=timeline,
        max_concurrency=int(config.rollout.max_batch),
    )
    planner = Planner(
        config.schedule,
        int(rl.num_groups),
        int(rl.group_size),
        _max_chunk_tokens(config),
        rl.max_open_groups or None,
    )
    learner = run.learner
    learner.begin(state.params, int(state.step))

    def on_chunk(chunk, start, end):
        ids = [it.item_id for it in chunk if it.payload is not None]
        if ids:  # member-closing items alone are no learner work
            timeline.record(
                metrics.CHUNK,
                start,
                end,
                group=chunk[0].group,
                ids=ids,
                tokens=sum(it.num_tokens for it in chunk),
            )

    stats = run_learner_batch(
        planner,
        arrivals,
        learner.process,
        on_chunk=on_chunk,
        timeout_s=float(config.rollout.request_timeout_s) * config.rollout.max_turns,
    )
    thread.join()

    with timeline.span(metrics.OPT):
        grads = learner.finalize()
        new_state, applied, grad_norm = run.apply_update(state, grads)
        jax.block_until_ready(new_state.params)
    if not bool(applied):
        log_skipped_update(log, step, grad_norm)
    with timeline.span(metrics.PUBLISH):
        run.fleet.publish(new_state.params, int(new_state.step))

    rewards = sorted(float(e.attrs["reward"]) for e in timeline.events(metrics.ROLLOUT))
    out = metrics.step_metrics(timeline)
    out.update(
        step=step,
        max_policy_lag=0,  # check_version refused any turn of another version
        open_groups_peak=int(planner.open_groups_peak),
        accum_bytes_peak=int(components.tree_bytes(learner.state)),
        reward_mean=float(np.mean(rewards)) if rewards else 0.0,
        tokens=int(learner.tokens),
        compiles=int(chunks.total_compiles() + learner.compiles),
        grad_norm=float(grad_norm),
        update_skipped=not bool(applied),
        reverse_kl=float(learner.reverse_kl),
        turns=int(learner.turns),
        rollout_failures=len(stats.failures),
        verifier_failures=components.verifier_failure_count(),
    )
    components.save_step_artifacts(config, run.workdir, step, timeline)
    log.info("step %d: %s", step, json.dumps({k: out[k] for k in sorted(out)}))
    return new_state, out
