"""The learner's train state and its one optimizer step per batch.

The state is one explicit pytree (params, optimizer state, step, RNG, data
position) so Orbax can checkpoint it whole and a restarted run resumes exactly.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adamw", "adam", "sgd")
# Adam's moments stay float32 whatever `model.param_dtype` is (DESIGN §7).
MOMENT_DTYPE = jnp.float32


class TrainState(NamedTuple):
    """Everything a resumed run needs.

    Attributes:
      step: optimizer steps taken (int32); also the policy version.
      params: trainable parameters (full model, or LoRA adapters).
      opt_state: optax state of `params`.
      rng: PRNG key data (uint32[2]) for anything random in the learner.
      data_position: index of the next batch of prompts (int32).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    data_position: jax.Array


# Params that are constants of the checkpoint, not trained: a MoE router's correction bias only
# shifts the (discrete) expert choice, so no gradient reaches it; weight decay must not either.
NOT_DECAYED = ("e_score_correction_bias",)


def decayed(params: Any) -> Any:
    """True for every param leaf weight decay applies to (all but `NOT_DECAYED`)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not any(n in jax.tree_util.keystr(path) for n in NOT_DECAYED), params
    )


def make_optimizer(cfg) -> optax.GradientTransformation:
    """optax chain from the `optim` config section; clipping acts on the finalized gradient."""
    name = cfg.name
    if name not in OPTIMIZERS:
        raise ValueError(f"optim.name={name!r}; valid: {', '.join(OPTIMIZERS)}")
    if not cfg.learning_rate > 0:
        raise ValueError(f"optim.learning_rate={cfg.learning_rate} must be > 0")
    lr = learning_rate_schedule(cfg.learning_rate, cfg.warmup_steps, cfg.decay_steps)
    if name == "adamw":
        opt = optax.adamw(
            lr,
            b1=cfg.b1,
            b2=cfg.b2,
            weight_decay=cfg.weight_decay,
            mu_dtype=MOMENT_DTYPE,
            mask=decayed,
        )
    elif name == "adam":
        opt = optax.adam(lr, b1=cfg.b1, b2=cfg.b2, mu_dtype=MOMENT_DTYPE)
    else:
        opt = optax.sgd(lr)
    if cfg.max_grad_norm and cfg.max_grad_norm > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
    return float32_state(opt)


def float32_state(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` with every parameter-shaped state leaf (Adam's mu and nu) in float32.

    optax's `mu_dtype` fixes only the first moment; the second is `zeros_like(params)`, so
    bfloat16 params would get a bfloat16 nu, whose 8-bit mantissa squares gradients into
    steps that are off by percents. Initializing on float32 stand-ins makes both moments
    float32 by choice; updates still come out float32 and `optax.apply_updates` casts the
    new params back to their own dtype.
    """

    def init(params):
        return inner.init(jax.tree.map(lambda p: p.astype(MOMENT_DTYPE), params))

    return optax.GradientTransformation(init, inner.update)


def learning_rate_schedule(peak: float, warmup_steps: int, decay_steps: int = 0):
    """The learning rate per applied update: warmup ramp, then constant or cosine decay.

    With `warmup_steps` w > 0 the first w updates ramp linearly: peak/w, 2·peak/w, …,
    peak. A freshly warm-started policy sits on a sharp optimum, and full-size steps
    before a few batches have been seen can knock it off (see configs/cpu.py). With
    `decay_steps` d > 0 the rate then follows a cosine from peak down to 0 at update d
    (and stays 0), so the last updates of a short run only polish. The count is the
    optimizer's own: a skipped (non-finite or all-zero) step does not advance it.
    """
    warmup_steps, decay_steps = int(warmup_steps), int(decay_steps)
    if warmup_steps < 0:
        raise ValueError(f"optim.warmup_steps={warmup_steps} must be >= 0")
    if decay_steps < 0 or (decay_steps and decay_steps <= warmup_steps):
        raise ValueError(
            f"optim.decay_steps={decay_steps} must be 0 (no decay) or > "
            f"optim.warmup_steps={warmup_steps}"
        )
    if warmup_steps == 0 and decay_steps == 0:
        return peak
    parts, boundaries = [], []
    if warmup_steps:
        parts.append(optax.linear_schedule(peak / warmup_steps, peak, warmup_steps - 1))
        boundaries.append(warmup_steps)
    parts.append(
        optax.cosine_decay_schedule(peak, decay_steps - warmup_steps)
        if decay_steps
        else optax.constant_schedule(peak)
    )
    return optax.join_schedules(parts, boundaries) if boundaries else parts[0]


def init_train_state(params, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.key_data(jax.random.key(seed)),
        data_position=jnp.zeros((), jnp.int32),
    )


def make_apply_update(
    optimizer: optax.GradientTransformation, skip_zero_grad: bool = False, donate: bool = True
):
    """Returns jitted `apply(state, grads) -> (state, applied, grad_norm)`.

    With `donate` (the default) the old state's buffers are given to the new state: at scale
    params + optimizer state are most of the device, and a second copy would not fit. The
    caller must not touch the `state` it passed in afterwards (it is deleted).

    A non-finite gradient leaves params and optimizer state untouched (the step
    is skipped, `applied` False) but still advances `step` and `data_position`, so
    the run moves on to the next batch and stays deterministic.

    With `skip_zero_grad`, an all-zero gradient is skipped the same way. In GRPO it
    means every group's rewards were equal: the batch carries no learning signal, yet
    Adam would still move every parameter by its momentum (about lr·sign of the last
    real gradient, for tens of steps), which wrecks a small, sharp policy.
    """

    @functools.partial(jax.jit, donate_argnums=(0,) if donate else ())
    def apply(state: TrainState, grads):
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(grad_norm)
        if skip_zero_grad:  # every element exactly 0 (the norm could underflow to 0 first)
            nonzero = jnp.any(jnp.stack([jnp.any(g != 0) for g in jax.tree.leaves(grads)]))
            applied = finite & nonzero
        else:
            applied = finite
        safe = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
        updates, new_opt = optimizer.update(safe, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(applied, a, b), new, old)
        return (
            TrainState(
                step=state.step + 1,
                params=keep(new_params, state.params),
                opt_state=keep(new_opt, state.opt_state),
                rng=state.rng,
                data_position=state.data_position + 1,
            ),
            applied,
            grad_norm,
        )

    return apply


def log_skipped_update(log, step: int, grad_norm) -> None:
    """The log line of a skipped update: a non-finite gradient, or one with nothing in it."""
    if bool(jnp.isfinite(grad_norm)):
        log.info("step %d: zero gradient (every group's rewards were equal); update skipped", step)
    else:
        log.warning("step %d: non-finite gradient (norm %s); update skipped", step, grad_norm)


def _param_shaped(tree: Any, like_treedef, like_shapes) -> bool:
    leaves = jax.tree.leaves(tree)
    return (
        jax.tree.structure(tree) == like_treedef and [tuple(x.shape) for x in leaves] == like_shapes
    )


def state_shardings(abstract_state: TrainState, trainable_shardings: Any, replicated) -> Any:
    """Shardings of a train state: params and every param-shaped optimizer subtree (Adam's
    moments) laid out like the trainable params; counters, RNG and the rest `replicated`."""
    treedef = jax.tree.structure(abstract_state.params)
    shapes = [tuple(x.shape) for x in jax.tree.leaves(abstract_state.params)]
    opt = jax.tree.map(
        lambda sub: trainable_shardings if _param_shaped(sub, treedef, shapes) else replicated,
        abstract_state.opt_state,
        is_leaf=lambda sub: (
            _param_shaped(sub, treedef, shapes)
            or not jax.tree.leaves(sub)
            or isinstance(sub, (jax.ShapeDtypeStruct, jax.Array))
        ),
    )
    return TrainState(
        step=replicated,
        params=trainable_shardings,
        opt_state=opt,
        rng=replicated,
        data_position=replicated,
    )


def init_sharded_train_state(
    trainable: Any, optimizer: optax.GradientTransformation, seed: int, shardings: TrainState
) -> TrainState:
    """`init_train_state` with every leaf created directly on its sharding (`state_shardings`).

    The trainable params are placed on their shardings (no copy when they already are);
    the optimizer state is made by one jitted init whose outputs land sharded, so no moment
    ever exists whole on one device.
    """
    params = jax.device_put(trainable, shardings.params)
    opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
    rest = jax.device_put(
        (jnp.zeros((), jnp.int32), jax.random.key_data(jax.random.key(seed))), shardings.step
    )
    return TrainState(
        step=rest[0],
        params=params,
        opt_state=opt_state,
        rng=rest[1],
        data_position=jax.device_put(jnp.zeros((), jnp.int32), shardings.data_position),
    )
