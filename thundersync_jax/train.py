"""The one training loop: every algorithm, schedule and task family.

    from thundersync_jax import train
    summary = train.run(config, workdir)        # the last step's metrics

Three independent choices: `rl.algorithm` (`algorithms.get`: GRPO, OPD), `schedule`
(`schedule.schedules.get`: sync, group, stream, async) and `env.family`
(`envs.task_families.get`: mini_swe, swe_jsonl, terminal).

Per step: every episode of the batch starts at once on the engines (policy version v);
the algorithm turns episodes into learner items as they appear (GRPO: finished
trajectories; OPD: teacher-scored turns); the planner, asking the schedule, decides when
each chunk runs; the algorithm's learner folds it into its accumulator, its per-batch state
threaded through pure functions. When the batch closes: finalize, one optimizer step,
publication (Orbax snapshot in shared memory), acknowledged by every engine before the next
batch starts. Under `async` the next batch's episodes run on policy v while the learner
trains on the previous batch, and they all end before v+1 is published, so each
trajectory is sampled by one policy (lag 1). Checkpoints, metrics, timelines and arrival
traces land in the workdir; rerunning the same command resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

import jax

from configs import common
from thundersync_jax import algorithms, distributed, evaluation, gpu_node, metrics
from thundersync_jax.algorithms.base import MemberEnd
from thundersync_jax.envs import task_families
from thundersync_jax.envs.trajectory import LoopLimits
from thundersync_jax.learner import regularizers
from thundersync_jax.learner.checkpoint import Checkpointer
from thundersync_jax.learner.train_state import log_skipped_update, make_apply_update
from thundersync_jax.rollout import engine_cmd
from thundersync_jax.schedule import episodes, run_files, schedules
from thundersync_jax.schedule.config_check import ConfigError, check_config, check_keys
from thundersync_jax.schedule.data_parallel import DataParallel
from thundersync_jax.schedule.engine_fleet import EngineFleet
from thundersync_jax.schedule.learner_loop import run_learner_batch
from thundersync_jax.schedule.planner import Planner
from thundersync_jax.schedule.setup import build_policy, export_final, start_engines
from thundersync_jax.sim import timelines

log = logging.getLogger(__name__)


def check(config, entry_algorithm: str | None = None):
    """Every start-up check; returns (algorithm, schedule, task family). Raises ConfigError."""
    check_keys(config, common.get_base_config())
    check_config(config)
    try:
        algo = algorithms.get(config.rl.algorithm)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if entry_algorithm is not None and algo.name != entry_algorithm:
        raise ConfigError(
            f"rl.algorithm={algo.name!r} but this entry point runs {entry_algorithm!r}: use "
            f"the {algo.name} entry point (experiments.swe_grpo for grpo, "
            "experiments.terminal_opd for opd) or set --config.rl.algorithm accordingly"
        )
    algo.check_config(config)
    try:
        regularizers.term_coefficients(config.rl)  # rejects a bad kl_estimator
        # Engines and their GPUs (rollout and teacher): before anything is built or started.
        engine_cmd.check_engine_config(config)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return algo, schedules.get(config.schedule), task_families.get(config.env.family)


@dataclasses.dataclass
class _RunParts:
    """The fixed pieces of one training run (built once, read by every step)."""

    config: Any
    workdir: str
    algo: algorithms.Algorithm
    schedule: schedules.Schedule
    tasks: list
    tok: Any
    fleet: EngineFleet
    services: Any
    learner: algorithms.BatchLearner
    policy: Any
    apply_update: Any
    dp: DataParallel

    def launch(self, step: int) -> episodes.BatchRollouts:
        """Starts every episode of `step` on the engines' current policy."""
        c = self.config
        timeline = metrics.Timeline(schedule=self.schedule.name)
        return episodes.launch_batch(
            step=step,
            seed=int(c.seed),
            num_groups=int(c.rl.num_groups),
            group_size=int(c.rl.group_size),
            make_env=task_families.env_factory(c, self.tasks, self.workdir, step),
            sampler=self.fleet.sampler,
            tok=self.tok,
            limits=LoopLimits.from_config(c.rollout),
            work=self.algo.episode_work(self.services, timeline),
            timeline=timeline,
            max_concurrency=int(c.rollout.max_batch),
            groups=self.dp.owned_groups(int(c.rl.num_groups)),
        )

    def publish(self, trainable, version: int) -> None:
        """Sends the policy for `trainable` to every engine (merged or adapters under LoRA)."""
        if not self.policy.is_lora:
            self.fleet.publish(trainable, version)
            return
        tree = self.policy.publishable(trainable)
        kind = self.policy.publish_kind
        self.fleet.manager.publish(tree, int(version), self.fleet.root, kind=kind)


def _prepare_workdir(config, workdir: str, info: distributed.ProcessInfo) -> str:
    """The shared workdir; process 0 writes config.json and train.log, process p>0 logs to
    DIR/processes/p/train.log."""
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    if not info.is_main:
        own = os.path.join(workdir, "processes", str(info.index))
        os.makedirs(own, exist_ok=True)
        run_files.configure_logging(own)
        return workdir
    run_files.configure_logging(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))
    return workdir


def run(config, workdir: str, *, entry_algorithm: str | None = None) -> dict:
    """Runs (or resumes) training; returns the last step's metrics ({} if nothing to train).

    Args:
      config: a configs/*.py ConfigDict.
      workdir: output directory; an existing one resumes from its newest checkpoint.
      entry_algorithm: the algorithm the calling entry point is for; a config asking for
        another is a ConfigError (None: whatever `rl.algorithm` says).
    """
    gpu_node.apply_learner_env(config)  # before JAX starts: its own GPUs, no 75% grab
    algo, schedule, family = check(config, entry_algorithm)
    info = distributed.initialize(config.get("distributed"))  # before any other JAX call
    with distributed.exit_on_failure():  # a failing replica must not hang the others
        metrics = _run_processes(config, workdir, info, algo, schedule, family)
        distributed.finish(info)  # every process leaves together (no torn-down peers)
    return metrics


def _run_processes(config, workdir: str, info, algo, schedule, family) -> dict:
    """`run` once this process has joined the others (or runs alone)."""
    started = time.monotonic()
    workdir = _prepare_workdir(config, workdir, info)
    dp = DataParallel.from_config(config, info)
    ckpt = Checkpointer(workdir, keep=int(config.checkpoint.keep), global_mesh=dp.global_mesh)
    built = build_policy(config, family, workdir, checkpointer=ckpt)
    state = built.state
    if built.resumed:
        log.info("resumed from checkpoint at step %d", int(state.step))
    first_step = int(state.step)
    if info.is_main:
        run_files.trim_metrics(workdir, first_step)
    if first_step >= config.num_steps:
        full = built.policy.full_params(state.params)
        path = export_final(built.graphdef, full, workdir, built.tok) if info.is_main else ""
        log.info("nothing to train (step %d of %d); final policy at %s", first_step,
                 config.num_steps, path)  # fmt: skip
        ckpt.close()
        return {}
    learner = algo.make_learner(_learner_setup(config, built))
    # Metrics come from process 0 (merged over every process's groups, `DataParallel`).
    writer, progress = _NoOutput(), _NoOutput()
    if info.is_main:
        writer = metrics.MetricsWriter(workdir, tensorboard=bool(config.metrics.tensorboard))
        desc = f"{algo.name}/{schedule.name}"
        progress = metrics.StepProgress(config.num_steps, desc=desc, initial=first_step)
    fleet = services = None
    last: dict = {}
    # Held-out pass@k between steps (process 0; None unless eval.every_steps), its tasks and
    # images resolved before any engine starts.
    evaluator = None
    if info.is_main:
        evaluator = evaluation.Evaluator.start(config, workdir, built.tok, started)
    try:
        fleet, services = start_engines(config, workdir, built, algo)
        parts = _RunParts(
            config=config,
            workdir=workdir,
            algo=algo,
            schedule=schedule,
            tasks=built.tasks,
            tok=built.tok,
            fleet=fleet,
            services=services,
            learner=learner,
            policy=built.policy,
            apply_update=make_apply_update(
                built.optimizer, skip_zero_grad=bool(config.optim.skip_zero_grad)
            ),
            dp=dp,
        )
        state, last = _train_steps(parts, state, first_step, ckpt, writer, progress, evaluator)
        if info.is_main:
            full = built.policy.full_params(state.params)
            export_final(built.graphdef, full, workdir, built.tok)
    finally:
        progress.close()
        writer.close()
        for closable in (services, fleet):
            if closable is not None:
                closable.close()
        ckpt.close()
    return last


def _learner_setup(config, built) -> algorithms.LearnerSetup:
    return algorithms.LearnerSetup(
        config,
        built.graphdef,
        built.reference_params,
        built.policy.is_lora,
        built.tok.pad_id,
        grad_shardings=built.learner.state_shardings.params,
        rows=built.learner.rows,
    )


def _train_steps(parts: _RunParts, state, first_step: int, ckpt, writer, progress, evaluator):
    """Every step from `first_step` on, checkpointed; returns (state, the last step's metrics).

    `evaluator` (None = off) scores held-out tasks after a step, on the engines' new policy.
    """
    config = parts.config
    parts.fleet.drop_versions_from(first_step)
    parts.publish(state.params, first_step)
    pending = None  # pipelined schedules: the next batch's rollouts, already running
    # What a batch learner hands its next batch (OPD `auto`: the granularity chooser's
    # timings; host numbers). Not checkpointed: a resumed run explores again.
    carry = None
    last: dict = {}
    for step in range(first_step, config.num_steps):
        state, pending, last, carry = _train_step(parts, step, state, pending, carry)
        if evaluator is not None:
            last.update(evaluator.after_step(step, parts.fleet.manager))
        writer.write(step, last)
        progress.update(last)
        every = int(config.checkpoint.every)
        if every and ((step + 1) % every == 0 or step + 1 == config.num_steps):
            ckpt.save(state)
    return state, last


class _NoOutput:
    """What processes other than 0 write metrics and progress to: nothing (process 0 writes
    them for all, `DataParallel.merge_metrics`)."""

    def write(self, step: int, values: dict) -> None:
        del step, values

    def update(self, values: dict) -> None:
        del values

    def close(self) -> None:
        pass


def _train_step(parts: _RunParts, step: int, state, pending, carry=None):
    """One batch: rollouts, learner work, optimizer step, publication.

    `carry` is the previous batch's `learner.carry` (None on the first step of a process).
    Returns (new state, the next batch's rollouts if pipelined else None, the step's metrics,
    this batch's carry).
    """
    config, rl, schedule = parts.config, parts.config.rl, parts.schedule
    version = int(state.step)
    compiles_before = parts.learner.compiles()
    current = pending or parts.launch(step)
    nxt = None
    if schedule.pipelined and step + 1 < config.num_steps:
        nxt = parts.launch(step + 1)  # sampled by policy `version` while this batch trains
    timeline = current.timeline
    planner = _planner(parts)

    def on_chunk(chunk, start, end):
        ids = [it.item_id for it in chunk if not isinstance(it.payload, MemberEnd)]
        if ids:  # member-closing items alone are no learner work
            tokens = sum(it.num_tokens for it in chunk)
            timeline.record(metrics.CHUNK, start, end, group=chunk[0].group, ids=ids, tokens=tokens)

    batch = parts.learner.init(
        state.params,
        version,
        parts.policy.base,
        enforce_version=schedule.enforces_version,
        carry=carry,
    )
    batch, stats = run_learner_batch(
        planner,
        current.queue,
        batch,
        parts.learner.process,
        on_chunk=on_chunk,
        timeout_s=float(config.rollout.request_timeout_s) * config.rollout.max_turns,
    )
    current.thread.join()
    if nxt is not None:
        # Honest async: every episode of step n+1 ends on policy n before the weight swap (the
        # barrier `sim.simulate` models: T = max(rollouts, learner work) + opt + publish).
        nxt.thread.join()

    with timeline.span(metrics.OPT):
        batch = parts.learner.close_groups(batch, stats.failed_groups)
        grads = parts.dp.finalize(parts.learner, batch)  # the whole batch's ∇L on every process
        new_state, applied, grad_norm = parts.apply_update(state, grads)
        jax.block_until_ready(new_state.params)
    parts.dp.after_update(new_state, step)
    if not bool(applied):
        log_skipped_update(log, step, grad_norm)
    with timeline.span(metrics.PUBLISH):
        parts.publish(new_state.params, int(new_state.step))

    out = _step_metrics(parts, step, timeline, batch, planner, compiles_before)
    out.update(
        grad_norm=float(grad_norm),
        update_skipped=not bool(applied),
        rollout_failures=len(stats.failures),
    )
    out = parts.dp.merge_metrics(out, batch.tally, int(rl.num_groups) * int(rl.group_size))
    if parts.dp.info.is_main:
        _save_step_artifacts(config, parts.workdir, step, timeline)
    log.info("step %d: %s", step, json.dumps({k: out[k] for k in sorted(out)}))
    return new_state, nxt, out, parts.learner.carry(batch)


def _planner(parts: _RunParts) -> Planner:
    """The batch's planner over this process's groups."""
    config, rl = parts.config, parts.config.rl
    planner = Planner(
        parts.schedule,
        int(rl.num_groups),
        int(rl.group_size),
        parts.algo.max_chunk_tokens(config),
        rl.max_open_groups or None,
        max_chunk_items=1 if rl.deterministic else None,
        # Each open OPD trajectory keeps a learner KV cache: cap them (backpressure).
        max_open_members=int(rl.max_open_trajectories) or None,
    )
    planner.exclude_groups(parts.dp.other_groups(int(rl.num_groups)))  # other processes' groups
    return planner


def _step_metrics(
    parts: _RunParts, step: int, timeline, batch, planner, compiles_before: int
) -> dict:
    """The step's timings, the learner's metrics and what the batch kept, before the merge."""
    out = metrics.step_metrics(timeline)
    out.update(parts.learner.metrics(batch))
    for failure in batch.tally.verifier_failures:
        log.warning("step %d: verifier failed for %s", step, failure)
    out.update(
        step=step,
        open_groups_peak=int(planner.open_groups_peak),
        # The tallies plus what the learner kept beside them (OPD: open trajectories' caches).
        accum_bytes_peak=int(_tree_bytes(parts.learner.accumulator_state(batch)))
        + int(parts.learner.kept_bytes_peak(batch)),
        compiles=int(parts.learner.compiles() - compiles_before),
    )
    return out


def _save_step_artifacts(config, workdir: str, step: int, timeline: metrics.Timeline) -> None:
    """Arrival trace every step (for the benchmark); timeline picture + Chrome trace every N."""
    timelines.export_arrivals(timeline, os.path.join(workdir, "traces", "arrivals.jsonl"), step)
    every = int(config.metrics.timeline_every)
    if every and step % every == 0:
        out = os.path.join(workdir, "timelines")
        os.makedirs(out, exist_ok=True)
        metrics.plot_timeline(timeline, os.path.join(out, f"step{step:05d}.png"))
        metrics.write_chrome_trace(timeline, os.path.join(out, f"step{step:05d}.trace.json"))


def _tree_bytes(tree) -> int:
    """Bytes held by the arrays of a pytree (accumulator memory metric)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))
