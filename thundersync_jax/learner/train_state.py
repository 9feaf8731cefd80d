"""The learner's train state and its one optimizer step per batch.

The state is one explicit pytree (params, optimizer state, step, RNG, data
position) so Orbax can checkpoint it whole and a restarted run resumes exactly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adamw", "adam", "sgd")


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


def make_optimizer(cfg) -> optax.GradientTransformation:
    """optax chain from the `optim` config section; clipping acts on the finalized gradient."""
    name = cfg.name
    if name not in OPTIMIZERS:
        raise ValueError(f"optim.name={name!r}; valid: {', '.join(OPTIMIZERS)}")
    if not cfg.learning_rate > 0:
        raise ValueError(f"optim.learning_rate={cfg.learning_rate} must be > 0")
    lr = learning_rate_schedule(
        cfg.learning_rate, cfg.get("warmup_steps", 0), cfg.get("decay_steps", 0)
    )
    if name == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    elif name == "adam":
        opt = optax.adam(lr, b1=cfg.b1, b2=cfg.b2)
    else:
        opt = optax.sgd(lr)
    if cfg.max_grad_norm and cfg.max_grad_norm > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
    return opt


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


def make_apply_update(optimizer: optax.GradientTransformation, skip_zero_grad: bool = False):
    """Returns jitted `apply(state, grads) -> (state, applied, grad_norm)`.

    A non-finite gradient leaves params and optimizer state untouched (the step
    is skipped, `applied` False) but still advances `step` and `data_position`, so
    the run moves on to the next batch and stays deterministic.

    With `skip_zero_grad`, an all-zero gradient is skipped the same way. In GRPO it
    means every group's rewards were equal: the batch carries no learning signal, yet
    Adam would still move every parameter by its momentum (about lr·sign of the last
    real gradient, for tens of steps), which wrecks a small, sharp policy.
    """

    @jax.jit
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
