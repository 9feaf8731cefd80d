"""What the training loop builds once per run: the policy and its train state, the engines.

`build_policy` is the one place where the tokenizer, the warm-started model, its params, the
trainable side (full or LoRA), the optimizer and the train state are created, so a sharded
or checkpoint-loading variant replaces one call. `start_engines` starts the student's
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

from flax import nnx

from thundersync_jax.learner import sft
from thundersync_jax.learner.train_state import TrainState, init_train_state, make_optimizer
from thundersync_jax.models import qwen3, tokenizer
from thundersync_jax.schedule import components, lora_policy

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
      state: the initial train state (before any checkpoint is restored).
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


def warm_start(config, examples: Callable[[], list], workdir: str) -> qwen3.Qwen3:
    """The initial policy: an HF checkpoint, a random init, or SFT on the demonstrations."""
    if config.sft.steps == 0:
        if config.model.checkpoint:
            return qwen3.from_pretrained(config.model.checkpoint)
        return qwen3.Qwen3(
            qwen3.Qwen3Config.from_config_dict(config.model), rngs=nnx.Rngs(int(config.seed))
        )
    cache = config.sft.cache_dir or workdir  # tests share one warm start across runs
    result = sft.train_sft_from_config(config, examples(), cache, name="student")
    log.info("warm start: %s (cache hit: %s)", result.path, result.cache_hit)
    return result.model


def build_policy(config, family, workdir: str) -> BuiltPolicy:
    """Tokenizer, tasks, warm-started model, trainable params, optimizer and train state."""
    tok = tokenizer.load(config.tokenizer.path or config.tokenizer.kind)
    tasks = family.build_tasks(config, workdir)
    examples = functools.cache(lambda: family.demonstrations(config, tasks, tok, workdir))
    model = warm_start(config, examples, workdir)
    graphdef, params = nnx.split(model, nnx.Param)
    # Under LoRA the state holds only the adapters; `params` (the warm start) stays frozen.
    policy = lora_policy.make_policy(config, params)
    optimizer = make_optimizer(config.optim)
    state = init_train_state(policy.trainable, optimizer, int(config.seed))
    return BuiltPolicy(tok, tasks, examples, model.cfg, graphdef, params, policy, optimizer, state)


def export_final(graphdef, params, workdir: str) -> str:
    """The final policy as an HF directory, DIR/final/."""
    path = os.path.join(workdir, "final")
    qwen3.save_pretrained(nnx.merge(graphdef, params), path)
    return path


def start_engines(config, workdir: str, built: BuiltPolicy, algo) -> tuple[Any, Any]:
    """The student's engine fleet and the algorithm's services, started side by side."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fleet_f = pool.submit(components.EngineFleet, config, workdir, built.tok, built.model_cfg)
        try:
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
