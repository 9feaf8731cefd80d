"""Model, params and train state of a run, made directly on the learner mesh: one call.

    built = build_learner_model(config, warm_model=None, checkpointer=ckpt)
    built.state            # TrainState on `built.state_shardings` (restored when resuming)
    built.params           # the full model params (the warm start; LoRA's frozen base)

Order of work, so that no tensor is ever whole on one device: the architecture (from
`model.checkpoint`'s config.json, else the `model` section) → abstract params with
`nnx.eval_shape` → NamedShardings from the logical-axis rules of `config.mesh` → the params
themselves: read shard by shard from safetensors, or initialized by one jitted init whose
outputs are sharded, or (a warm start trained in this process) cast and placed. Params are
stored in `model.param_dtype` and computed in `model.dtype`; Adam's moments are float32
(`train_state.float32_state`); resuming restores the Orbax checkpoint straight into the
state's shardings.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from thundersync_jax.learner import lora_policy
from thundersync_jax.learner import mesh as mesh_lib
from thundersync_jax.learner import train_state as ts
from thundersync_jax.models import auto, sharding

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LearnerModel:
    """Everything the learner needs about the policy, placed on the mesh.

    Attributes:
      mesh: the ("fsdp", "tp") learner mesh of `config.mesh`.
      model_cfg: the architecture (the checkpoint's config.json when one is given).
      graphdef: the model structure (compute dtype `model.dtype`); merge with params to call.
      params: full model params in `model.param_dtype` on `param_shardings`. Without LoRA
        they are `state.params` at step 0, so the first (donating) update consumes them.
      param_shardings: NamedSharding pytree of `params`.
      policy: the trainable side (`lora_policy.Policy`; its `.trainable` seeded the state).
      optimizer: the optax chain of `config.optim` (float32 moments).
      state: the train state (trainable params, optimizer state, counters), sharded.
      state_shardings: NamedShardings of `state` (Orbax restores into them).
      rows: NamedSharding of chunk rows ([B, T] split over "fsdp").
      resumed: True when `state` came from the checkpointer.
    """

    mesh: Mesh
    model_cfg: Any
    graphdef: nnx.GraphDef
    params: Any
    param_shardings: Any
    policy: Any
    optimizer: optax.GradientTransformation
    state: ts.TrainState
    state_shardings: ts.TrainState
    rows: NamedSharding
    resumed: bool


def model_config(config: Any) -> Any:
    """The run's architecture: the checkpoint's config.json, else the `model` section
    (any `models.auto` family: dense Qwen3/Qwen2, Qwen3-MoE, GLM-4.7-Flash)."""
    path = str(config.model.get("checkpoint", "") or "")
    if not path:
        return auto.config_from_section(config.model)
    cfg = auto.read_config(path)
    section = auto.config_from_section(config.model)
    if type(section) is not type(cfg):
        log.info("architecture from %s/config.json: %s", path, cfg)
        return cfg
    differ = [
        f"{f.name}={getattr(cfg, f.name)!r} (config says {getattr(section, f.name)!r})"
        for f in dataclasses.fields(cfg)
        if f.name not in ("bos_token_id", "eos_token_id")
        and getattr(cfg, f.name) != getattr(section, f.name)
    ]
    if differ:
        log.info("architecture from %s/config.json: %s", path, "; ".join(differ))
    return cfg


def abstract_model(config: Any, cfg: Any) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, abstract params) in the config's dtypes; nothing is allocated."""
    dtype, param_dtype = jnp.dtype(config.model.dtype), jnp.dtype(config.model.param_dtype)
    m = config.model
    options = dict(
        remat_offload=bool(m.remat_offload),
        attention_impl=str(m.attention_impl),
        attention_block=int(m.attention_block),
        logits_tile=int(m.logits_tile),
    )
    model = nnx.eval_shape(lambda: auto.build(cfg, dtype=dtype, param_dtype=param_dtype, **options))
    if m.scan_layers:
        if not hasattr(model, "scan_layers"):
            raise ValueError(
                f"model.scan_layers=True: {type(model).__name__} has no scanned layer path "
                "(dense Qwen3 only); set model.scan_layers=False"
            )
        model.scan_layers = True  # a static attribute: it travels in the graphdef
    return nnx.split(model, nnx.Param)


def _initial_params(config, cfg, graphdef, shardings, warm_model) -> Any:
    """The params before any RL step: a warm model, the checkpoint, or a random init."""
    param_dtype = jnp.dtype(config.model.param_dtype)
    cast = lambda s: jax.tree.map(lambda x: x.astype(param_dtype), s)  # noqa: E731
    if warm_model is not None:
        return jax.jit(cast, out_shardings=shardings)(nnx.split(warm_model, nnx.Param)[1])
    path = str(config.model.get("checkpoint", "") or "")
    if path:
        return auto.load_sharded_params(path, cfg, shardings, param_dtype)
    seed, dtype = int(config.seed), jnp.dtype(config.model.dtype)

    def init():
        model = auto.build(cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed))
        return nnx.split(model, nnx.Param)[1]

    return jax.jit(init, out_shardings=shardings)()


def build_learner_model(
    config: Any,
    *,
    warm_model: nnx.Module | None = None,
    make_policy: Callable[[Any], Any] | None = None,
    checkpointer: Any = None,
    devices: Any = None,
) -> LearnerModel:
    """Model, params and train state of `config`, each created on its sharding.

    Args:
      config: the run config (`model`, `mesh`, `optim`, `seed` sections).
      warm_model: a policy trained in this process (SFT warm start); else the params come
        from `model.checkpoint`, or a random init from `seed`.
      checkpointer: a `learner.checkpoint.Checkpointer`; its newest checkpoint, if any,
        becomes the state (restored into the state's shardings).
      devices: the mesh's devices (default: this process's).
    """
    mesh = mesh_lib.learner_mesh(config.mesh, devices)
    cfg = model_config(config)
    graphdef, abstract = abstract_model(config, cfg)
    rules = sharding.rules_from_config(config.mesh)
    param_shardings = sharding.param_shardings(abstract, rules, mesh)
    params = _initial_params(config, cfg, graphdef, param_shardings, warm_model)
    policy = lora_policy.make_policy(config, params)  # the params, or LoRA adapters over them
    trainable = policy.trainable
    # Trainables that are not the params (LoRA adapters) are small: one copy per device.
    same = trainable is params
    trainable_sh = param_shardings if same else sharding.replicated(trainable, mesh)
    optimizer = ts.make_optimizer(config.optim)
    replicated = mesh_lib.replicated(mesh)
    abstract_state = jax.eval_shape(
        lambda t: ts.init_train_state(t, optimizer, int(config.seed)), trainable
    )
    state_sh = ts.state_shardings(abstract_state, trainable_sh, replicated)
    state, resumed = None, False
    if checkpointer is not None and checkpointer.latest_step() is not None:
        state = checkpointer.restore_latest(with_shardings(abstract_state, state_sh))
        resumed = state is not None
    if state is None:
        state = ts.init_sharded_train_state(trainable, optimizer, int(config.seed), state_sh)
    return LearnerModel(
        mesh=mesh,
        model_cfg=cfg,
        graphdef=graphdef,
        params=params,
        param_shardings=param_shardings,
        policy=policy,
        optimizer=optimizer,
        state=state,
        state_shardings=state_sh,
        rows=mesh_lib.batch_sharding(mesh),
        resumed=resumed,
    )


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs that carry their target sharding (what Orbax restores into)."""
    # `shardings` is a pytree prefix of `abstract` (one sharding may stand for a subtree).
    full = jax.tree.map(
        lambda s, sub: jax.tree.map(lambda _: s, sub),
        shardings,
        abstract,
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
    )
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, full
    )


def warm_start_steps(config: Any) -> int:
    """SFT steps of the warm start: `sft.steps`, but 0 when a checkpoint is given (unless
    `sft.on_checkpoint`): a user's checkpoint is not fine-tuned on toy demonstrations."""
    steps = int(config.sft.steps)
    if config.model.get("checkpoint") and not config.sft.on_checkpoint:
        if steps:
            log.info("model.checkpoint given: warm start skipped (sft.on_checkpoint=False)")
        return 0
    return steps
