"""Terminal-task plumbing for the OPD trainer: the task pool, environments, demonstrations.

Kept apart from `components.py` (the SWE task family of the GRPO trainer) so each trainer's
setup reads on its own. Group k of step n runs task (n·K + k) mod |tasks|, as for GRPO.
"""

from __future__ import annotations

import logging

from thundersync_jax.envs import agent_demos, agent_loop, terminal
from thundersync_jax.learner import sft

log = logging.getLogger(__name__)

DIFFICULTIES = {"easy": (1,), "medium": (1, 2), "hard": (1, 2, 3)}


def build_tasks(config) -> list[terminal.TerminalTask]:
    """`env.num_tasks` terminal tasks of `env.difficulty` (and `env.terminal_families`)."""
    env = config.env
    if env.difficulty not in DIFFICULTIES:
        raise ValueError(
            f"env.difficulty={env.difficulty!r} for terminal tasks; "
            f"valid: {', '.join(DIFFICULTIES)}"
        )
    families = tuple(env.get("terminal_families", ()) or ()) or None
    return terminal.generate_tasks(
        int(env.num_tasks), int(config.seed), families, DIFFICULTIES[env.difficulty]
    )


def make_env(config, task: terminal.TerminalTask) -> terminal.TerminalEnv:
    return terminal.TerminalEnv(
        task, sandbox_kwargs={"memory_mb": int(config.env.sandbox_memory_mb)}
    )


def env_factory(config, tasks: list, step: int):
    """(group, member) -> a fresh TerminalEnv for `step`; every member of a group shares a task."""
    k_per_step = int(config.rl.num_groups)

    def make(group: int, member: int) -> terminal.TerminalEnv:
        del member
        return make_env(config, tasks[(step * k_per_step + group) % len(tasks)])

    return make


def demonstrations(config, tasks: list, tok) -> list[sft.SFTExample]:
    """Solved demonstrations that fit the run's budgets (the warm start's and teacher's data)."""
    limits = agent_loop.LoopLimits.from_config(config.rollout)
    examples = agent_demos.demonstration_examples(
        [lambda t=t: make_env(config, t) for t in tasks], tok, limits, require_solved=False
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
