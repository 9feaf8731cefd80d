"""The task families a run can train on, in one registry: `env.family` picks one.

    family = task_families.get(config.env.family)      # clear error naming the valid ones
    tasks = family.build_tasks(config, workdir)
    env = family.make_env(config, tasks[i], workdir)
    examples = family.demonstrations(config, tasks, tok, workdir)   # warm start / teacher data
    held_out = eval_tasks(config, workdir)              # the in-loop evaluation's tasks

Every family works with every algorithm: GRPO and OPD only see `Environment`s and
`SFTExample`s. Group k of step n plays task (n·K + k) mod |tasks| (`env_factory`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from thundersync_jax.envs import agent_demos, terminal
from thundersync_jax.envs.swe import factory
from thundersync_jax.envs.trajectory import LoopLimits

log = logging.getLogger(__name__)

TERMINAL_DIFFICULTIES = {"easy": (1,), "medium": (1, 2), "hard": (1, 2, 3)}


class TaskFamily(NamedTuple):
    """What the loop needs from a task family.

    Attributes:
      name: the `env.family` value.
      check: config -> None; raises ValueError naming a bad `env` value.
      build_tasks: (config, workdir) -> the run's task pool.
      make_env: (config, task, workdir) -> a fresh Environment for one episode.
      demonstrations: (config, tasks, tok, workdir) -> solved `SFTExample`s that fit the
        run's budgets (the student's warm start and an embedded teacher's data).
    """

    name: str
    check: Callable[[Any], None]
    build_tasks: Callable[[Any, str], list]
    make_env: Callable[[Any, Any, str], Any]
    demonstrations: Callable[[Any, list, Any, str], list]


def _check_swe(config) -> None:
    factory.difficulties(config.env.difficulty)
    if config.env.family == "swe_jsonl" and not config.env.instances:
        raise ValueError("env.family=swe_jsonl needs env.instances=<path to a SWE-bench JSONL>")
    if config.env.family == "swe_dataset" and not config.env.dataset:
        raise ValueError(
            "env.family=swe_dataset needs env.dataset=<a SWE-smith / SWE-bench dataset: "
            ".parquet, .jsonl, .json, a save_to_disk directory or hf:ORG/NAME[:SPLIT]> "
            "(and env.images=<image store> for its images); nothing falls back to "
            "generated tasks"
        )
    if config.env.family in ("swe_jsonl", "swe_dataset") and _evaluates(config):
        if not config.eval.dataset:
            raise ValueError(
                f"eval.every_steps={config.eval.every_steps} on env.family="
                f"{config.env.family} needs eval.dataset=<a SWE-bench-format dataset, e.g. "
                "SWE-bench Verified> (only generated families have held-out tasks of their own)"
            )


def _evaluates(config) -> bool:
    return "eval" in config and int(config.eval.every_steps) > 0


def _swe_tasks(config, workdir: str) -> list:
    return factory.load_instances(config.env, workdir, int(config.seed))


def _swe_env(config, task, workdir: str):
    return factory.make_environment(task, workdir, config.env)


def _swe_demos(config, tasks: list, tok, workdir: str) -> list:
    limits = LoopLimits.from_config(config.rollout)
    return agent_demos.demonstration_examples(
        [lambda t=t: _swe_env(config, t, workdir) for t in tasks],
        tok,
        limits,
        decoys=bool(config.sft.decoys),
    )


def _check_terminal(config) -> None:
    if config.env.difficulty not in TERMINAL_DIFFICULTIES:
        raise ValueError(
            f"env.difficulty={config.env.difficulty!r} for terminal tasks; "
            f"valid: {', '.join(TERMINAL_DIFFICULTIES)}"
        )
    unknown = [f for f in _terminal_families(config) or () if f not in terminal.FAMILIES]
    if unknown:
        raise ValueError(
            f"env.terminal_families has unknown {unknown}; valid: {', '.join(terminal.FAMILIES)}"
        )


def _terminal_families(config) -> tuple[str, ...] | None:
    return tuple(config.env.terminal_families) or None


def _terminal_tasks(config, workdir: str) -> list:
    del workdir  # terminal tasks are generated in memory
    env = config.env
    return terminal.generate_tasks(
        int(env.num_tasks),
        int(config.seed),
        _terminal_families(config),
        TERMINAL_DIFFICULTIES[env.difficulty],
    )


def _terminal_env(config, task, workdir: str):
    del workdir
    return terminal.TerminalEnv(
        task, sandbox_kwargs={"memory_mb": int(config.env.sandbox_memory_mb)}
    )


def _terminal_demos(config, tasks: list, tok, workdir: str) -> list:
    limits = LoopLimits.from_config(config.rollout)
    examples = agent_demos.demonstration_examples(
        [lambda t=t: _terminal_env(config, t, workdir) for t in tasks],
        tok,
        limits,
        require_solved=False,
    )
    kept = [ex for ex in examples if ex.complete and ex.reward >= 1.0]
    if not kept:
        raise ValueError(
            f"no terminal demonstration fits rollout.max_traj_tokens="
            f"{config.rollout.max_traj_tokens} / max_turns={config.rollout.max_turns}; raise them"
        )
    if len(kept) < len(examples):
        log.info(
            "demonstrations: kept %d of %d (the rest exceed the budgets)", len(kept), len(examples)
        )
    return kept


def _check_bench(config) -> None:
    if not config.env.dataset:
        raise ValueError(
            "env.family=terminal_bench needs env.dataset=<a directory of Terminal-Bench 2 (or "
            "1) task directories> and env.images=<the image store holding their images>"
        )
    if _evaluates(config) and not config.eval.dataset:
        raise ValueError(
            "eval.every_steps on env.family=terminal_bench needs eval.dataset=<a directory of "
            "held-out task directories>"
        )


def _bench_tasks(config, workdir: str) -> list:
    del workdir  # published tasks are read where they are
    env = config.env
    return terminal.load_bench_tasks(env.dataset, images=env.images, limit=int(env.num_tasks))


def _bench_env(config, task, workdir: str):
    return terminal.BenchTaskEnv(
        task,
        memory_mb=int(config.env.sandbox_memory_mb),
        workspace_parent=os.path.join(workdir, "episodes"),
    )


def _bench_demos(config, tasks: list, tok, workdir: str) -> list:
    solved = [t for t in tasks if t.solution]  # a task without a reference teaches nothing
    if not solved:
        raise ValueError("no terminal task has a reference solution (solution/solve.sh)")
    limits = LoopLimits.from_config(config.rollout)
    return agent_demos.demonstration_examples(
        [lambda t=t: _bench_env(config, t, workdir) for t in solved], tok, limits
    )


FAMILIES: dict[str, TaskFamily] = {
    "mini_swe": TaskFamily("mini_swe", _check_swe, _swe_tasks, _swe_env, _swe_demos),
    "swe_jsonl": TaskFamily("swe_jsonl", _check_swe, _swe_tasks, _swe_env, _swe_demos),
    "swe_dataset": TaskFamily("swe_dataset", _check_swe, _swe_tasks, _swe_env, _swe_demos),
    "terminal": TaskFamily(
        "terminal", _check_terminal, _terminal_tasks, _terminal_env, _terminal_demos
    ),
    "terminal_bench": TaskFamily(
        "terminal_bench", _check_bench, _bench_tasks, _bench_env, _bench_demos
    ),
}
NAMES = tuple(FAMILIES)


def get(name: str) -> TaskFamily:
    """The family registered as `name`; ValueError naming the valid ones otherwise."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"env.family={name!r} is not a task family; choose one of: {', '.join(NAMES)}"
        ) from None


def env_factory(config, tasks: list, workdir: str, step: int) -> Callable[[int, int], Any]:
    """(group, member) -> a fresh env for `step`: group k plays task (n·K + k) mod |tasks|."""
    family = get(config.env.family)
    k_per_step = int(config.rl.num_groups)

    def make(group: int, member: int):
        del member  # every member of a group gets the same prompt
        return family.make_env(config, tasks[(step * k_per_step + group) % len(tasks)], workdir)

    return make


# Held-out generated tasks come from another seed than the training pool's.
HELD_OUT_SEED_OFFSET = 1_000_003


def eval_tasks(config, workdir: str) -> list:
    """The in-loop evaluation's tasks: the first `eval.num_tasks` of `eval.dataset` (a SWE
    dataset, read like `env.dataset`, images from `env.images`), or, without one, held-out
    tasks the run's generated family makes from another seed (under workdir/eval)."""
    ev = config.eval
    num = int(ev.num_tasks)
    if ev.dataset and config.env.family == "terminal_bench":
        return terminal.load_bench_tasks(ev.dataset, images=config.env.images, limit=num)
    if ev.dataset:
        if config.env.family not in factory.FAMILIES:
            raise ValueError(
                f"eval.dataset is a SWE dataset; env.family={config.env.family!r} evaluates "
                "on held-out generated tasks (leave eval.dataset empty)"
            )
        return factory.dataset_instances(ev.dataset, config.env, num)
    if config.env.family not in ("mini_swe", "terminal"):
        raise ValueError(
            f"env.family={config.env.family!r} has no generated held-out tasks: set "
            "eval.dataset=<a SWE-bench-format dataset>"
        )
    held_out = config.copy_and_resolve_references()
    held_out.unlock()
    held_out.seed = int(config.seed) + HELD_OUT_SEED_OFFSET
    held_out.env.num_tasks = num
    return get(config.env.family).build_tasks(held_out, os.path.join(workdir, "eval"))
