"""What the training loop builds once per run: the policy and its train state, the engines.

`build_policy` is the one place where the tokenizer, the warm-started model, its params, the
trainable side (full or LoRA), the optimizer and the train state are created: on the
learner mesh of `config.mesh` (`learner.model_state`), restored from the newest checkpoint
when one exists. `start_engines` starts the student's
engines and the algorithm's services (OPD's teacher) side by side.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from thundersync_jax import distributed
from thundersync_jax.learner import export, lora_policy, model_state, regularizers, sft
from thundersync_jax.learner.train_state import TrainState
from thundersync_jax.models import qwen3, tokenizer
from thundersync_jax.schedule import demo_cache, engine_fleet

log = logging.getLogger(__name__)


class BuiltPolicy(NamedTuple):
    """The run's policy and everything made with it.

    Attributes:
      tok: the tokenizer.
      tasks: the task family's task pool.
      examples: () -> the family's demonstrations (computed once, on first call).
      model_cfg: the policy's architecture.
      graphdef: its model structure (`nnx.split`).
      reference_params: the warm start's full params (frozen: KL reference, LoRA base).
      policy: the trainable side (`lora_policy.Policy`).
      optimizer: the optax transformation.
      state: the train state on its shardings (restored from the newest checkpoint if any).
      resumed: whether `state` came from a checkpoint.
      learner: the `model_state.LearnerModel` (mesh, shardings, chunk-row sharding).
    """

    tok: Any
    tasks: list
    examples: Callable[[], list]
    model_cfg: qwen3.Qwen3Config
    graphdef: Any
    reference_params: Any
    policy: lora_policy.Policy
    optimizer: Any
    state: TrainState
    resumed: bool
    learner: model_state.LearnerModel


def warm_start(config, examples: Callable[[], list], workdir: str) -> qwen3.Qwen3 | None:
    """The policy trained on the demonstrations, or None: then `learner.model_state` loads
    `model.checkpoint` (shard by shard) or initializes randomly, directly on the mesh."""
    if model_state.warm_start_steps(config) == 0:
        return None
    cache = config.sft.cache_dir or workdir  # tests share one warm start across runs
    result = sft.train_sft_from_config(config, examples(), cache, name="student")
    log.info("warm start: %s (cache hit: %s)", result.path, result.cache_hit)
    return result.model


def build_policy(config, family, workdir: str, checkpointer=None) -> BuiltPolicy:
    """Tokenizer, tasks, warm start, trainable params, optimizer and train state, on the mesh."""
    tok = tokenizer.for_run(config)
    # Several learner processes share the workdir: process 0 writes the tasks and the warm
    # start's cache first, the others then find both (same files, same cached model).
    with distributed.main_first("tasks and warm start"):
        tasks = family.build_tasks(config, workdir)
        examples = functools.cache(
            lambda: demo_cache.cached_demonstrations(config, family, tasks, tok, workdir)
        )
        warm_model = warm_start(config, examples, workdir)
    # Under LoRA the state holds only the adapters; `params` (the warm start) stays frozen.
    built = model_state.build_learner_model(
        config,
        warm_model=warm_model,
        checkpointer=checkpointer,
    )
    reference = built.params
    if not built.policy.is_lora and regularizers.term_coefficients(config.rl):
        # The update donates the state, whose params are `params` without LoRA: the
        # regularizers' frozen reference needs its own copy.
        reference = jax.tree.map(jnp.copy, built.params)
    return BuiltPolicy(
        tok, tasks, examples, built.model_cfg, built.graphdef, reference, built.policy,
        built.optimizer, built.state, built.resumed, built,
    )  # fmt: skip


def export_final(graphdef, params, workdir: str, tok) -> str:
    """DIR/final: weights, config.json, generation_config.json and the tokenizer."""
    return export.export_policy(graphdef, params, os.path.join(workdir, "final"), tok)


def start_engines(config, workdir: str, built: BuiltPolicy, algo) -> tuple[Any, Any]:
    """The student's engine fleet and the algorithm's services, started side by side."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fleet_f = pool.submit(engine_fleet.EngineFleet, config, workdir, built.tok, built.model_cfg)
        try:
            with distributed.main_first("services"):  # e.g. OPD's teacher cache: process 0 first
                services = algo.start_services(config, built.model_cfg, built.examples, workdir)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the service's error, not the fleet's
                fleet_f.result().close()
            raise
        try:
            fleet = fleet_f.result()
        except BaseException:
            if services is not None:
                services.close()
            raise
    return fleet, services
