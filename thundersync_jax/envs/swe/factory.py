"""SWE task sets and environments from a config's `env` section (configs/common.py):
generated mini-SWE tasks, a SWE-bench JSONL (`swe_jsonl`), or a published dataset
(`swe_dataset`: SWE-bench / Verified / SWE-Gym / SWE-smith rows, `swe.dataset`).

instances = factory.load_instances(config.env, workdir, seed=config.seed)
make_env = lambda i: factory.make_environment(instances[i], workdir, config.env)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from thundersync_jax.envs.swe import dataset, mini_swe
from thundersync_jax.envs.swe.environment import SweEnvironment
from thundersync_jax.envs.swe.instance import SweInstance, load_jsonl

FAMILIES = ("mini_swe", "swe_jsonl", "swe_dataset")


def difficulties(spec: str) -> tuple[str, ...]:
    """ "easy" | "medium" | "hard" | a comma-separated list of them | "mixed" (all three)."""
    levels = mini_swe.DIFFICULTIES if spec == "mixed" else tuple(s.strip() for s in spec.split(","))
    bad = [lv for lv in levels if lv not in mini_swe.DIFFICULTIES]
    if bad or not levels:
        raise ValueError(
            f"env.difficulty {spec!r}: use one of {mini_swe.DIFFICULTIES}, a comma-separated "
            "list of them, or 'mixed'"
        )
    return levels


def load_instances(env_cfg: Any, workdir: str, seed: int) -> list[SweInstance]:
    """The task set: generated mini-SWE tasks (cached under workdir/mini_swe) or a JSONL file.

    A non-empty `env.image` (optional key) runs every task in that container image (an
    OCI layout or `docker save` tarball with python and pytest, e.g. from
    `python -m thundersync_jax.envs.images build`), the repository at /testbed.

    Args:
      env_cfg: has `family`, `num_tasks`, `difficulty` (mini_swe) and `instances` (swe_jsonl).
      workdir: the run directory.
      seed: fixes the generated task set.
    """
    image = str(getattr(env_cfg, "image", "") or "")
    instances = _task_set(env_cfg, workdir, seed)
    if image:
        image = os.path.abspath(image) if os.path.exists(image) else image
        instances = [dataclasses.replace(inst, image=image) for inst in instances]
    return instances


def _task_set(env_cfg: Any, workdir: str, seed: int) -> list[SweInstance]:
    family = env_cfg.family
    if family == "mini_swe":
        return mini_swe.generate(
            int(env_cfg.num_tasks),
            seed,
            os.path.join(workdir, "mini_swe"),
            difficulties(env_cfg.difficulty),
        )
    if family == "swe_jsonl":
        if not env_cfg.instances:
            raise ValueError("env.family=swe_jsonl needs env.instances (a JSONL path)")
        instances = load_jsonl(env_cfg.instances)
        return instances[: int(env_cfg.num_tasks)] if int(env_cfg.num_tasks) > 0 else instances
    if family == "swe_dataset":
        return dataset_instances(env_cfg.dataset, env_cfg, int(env_cfg.num_tasks))
    raise ValueError(f"env.family {family!r} is not a SWE family; SWE families: {FAMILIES}")


def dataset_instances(spec: str, env_cfg: Any, limit: int) -> list[SweInstance]:
    """The first `limit` instances of a published dataset (`swe.dataset`), their images
    found in `env.images`; every row checked and every image resolved here, before any
    training starts."""
    if not spec:
        raise ValueError("env.family=swe_dataset needs env.dataset")
    return dataset.load(
        spec, images=str(env_cfg.images or ""), fmt=str(env_cfg.dataset_format), limit=limit
    )


def make_environment(instance: SweInstance, workdir: str, env_cfg: Any) -> SweEnvironment:
    """An environment for one episode, sandboxed with the config's time and memory limits; with
    `env.cache_verdicts`, verdicts are kept in workdir/verdicts and reused for a patch already
    verified on the same task (`verdicts.py`)."""
    sandbox = {
        "timeout_s": float(env_cfg.sandbox_timeout_s),
        "memory_mb": int(env_cfg.sandbox_memory_mb),
    }
    # partial_credit is optional in the config: all-or-nothing unless it says otherwise.
    partial = bool(getattr(env_cfg, "partial_credit", False))
    verdict_dir = os.path.join(workdir, "verdicts") if env_cfg.cache_verdicts else None
    return SweEnvironment(
        instance,
        os.path.join(workdir, "episodes"),
        sandbox,
        partial_credit=partial,
        verdict_dir=verdict_dir,
    )
