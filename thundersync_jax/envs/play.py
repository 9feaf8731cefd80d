"""Playing the task family's tasks with a model in this process (no engines, no learner):
what evaluation and the step-size probe run."""

from __future__ import annotations

from thundersync_jax.envs import agent_loop, task_families
from thundersync_jax.envs.agent_samplers import GenerateSampler
from thundersync_jax.envs.trajectory import EpisodeIds, LoopLimits
from thundersync_jax.models import sampling


def build_tasks(config, workdir: str) -> list:
    """The task pool of the run (`env.family`'s, see `envs.task_families`)."""
    return task_families.get(config.env.family).build_tasks(config, workdir)


def make_env(config, task, workdir: str):
    return task_families.get(config.env.family).make_env(config, task, workdir)


def play_tasks(
    config, workdir: str, tasks: list, model, tok, samples: int, temperature: float, seed: int
) -> list:
    """Every task (`build_tasks`) played `samples` times by `model` (embedded
    sampler, the config's loop limits, real sandbox and verifier); returns the trajectories,
    whose `ids.prompt` is the task index and `ids.member` the sample index."""
    params = sampling.SamplingParams(
        temperature=temperature,
        max_new_tokens=config.rollout.max_new_tokens_per_turn,
        stop_token_ids=tuple(tok.stop_ids),
    )
    episodes = [
        agent_loop.Episode(
            lambda t=task: make_env(config, t, workdir),
            EpisodeIds(seed, 0, i, m),
        )
        for i, task in enumerate(tasks)
        for m in range(samples)
    ]
    max_batch = int(config.rollout.max_batch)
    with GenerateSampler(model, params, tok.pad_id, max_batch=max_batch) as s:
        limits = LoopLimits.from_config(config.rollout)
        return list(agent_loop.run_episodes(episodes, s, tok, limits, max_concurrency=max_batch))
