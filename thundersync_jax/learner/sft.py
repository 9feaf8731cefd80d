"""Supervised warm start on scripted demonstrations, cached in the work directory.

The model is trained next-token on the assistant tokens of rendered demonstrations
(`SFTExample`s, made by `thundersync_jax.envs.agent_demos` with the agent loop's own token
layout, so the model learns exactly the format it will later sample in).

    examples = agent_demos.demonstration_examples(make_envs, tok, limits)
    result = sft.train_sft(model_cfg, examples, workdir=DIR, steps=200, learning_rate=3e-3,
                           batch_size=8, name="student")
    result.model, result.losses, result.cache_hit

A second call with the same config and data loads `DIR/sft/<name>-<hash>/` (an HF
safetensors directory written by `auto.save_pretrained`) instead of retraining.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from thundersync_jax import losses
from thundersync_jax.models import auto

LOG_FILE = "sft_log.json"


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One rendered demonstration.

    Attributes:
      task_id: the environment's task id.
      tokens: int32 [T] transcript; loss_mask: bool [T], True on assistant tokens.
      reward: what the environment's verifier gave the demonstrated episode.
      complete: False when the token budget cut the demonstration short.
    """

    task_id: str
    tokens: np.ndarray
    loss_mask: np.ndarray
    reward: float
    complete: bool


@dataclasses.dataclass(frozen=True)
class SFTResult:
    """The trained (or loaded) model, its per-step losses, and where it is cached."""

    model: nnx.Module
    losses: list[float]
    cache_hit: bool
    path: str


def cache_key(cfg: Any, examples: Sequence[SFTExample], hparams: dict) -> str:
    """sha256 over the architecture, the hyperparameters and every example's tokens and mask."""
    h = hashlib.sha256()
    h.update(json.dumps({"model": cfg.to_hf(), "hparams": hparams}, sort_keys=True).encode())
    for ex in examples:
        h.update(np.ascontiguousarray(ex.tokens, np.int32).tobytes())
        h.update(np.ascontiguousarray(ex.loss_mask, np.bool_).tobytes())
        h.update(b"|")
    return h.hexdigest()


def pad_examples(examples: Sequence[SFTExample], multiple: int = 16) -> tuple[np.ndarray, ...]:
    """[N, L] tokens and masks, right-padded with 0 / False to a multiple of `multiple`."""
    if not examples:
        raise ValueError("no SFT examples to train on")
    longest = max(len(ex.tokens) for ex in examples)
    length = -(-longest // multiple) * multiple
    tokens = np.zeros((len(examples), length), np.int32)
    mask = np.zeros((len(examples), length), bool)
    for i, ex in enumerate(examples):
        tokens[i, : len(ex.tokens)] = ex.tokens
        mask[i, : len(ex.loss_mask)] = ex.loss_mask
    return tokens, mask


def next_token_loss(logits: jax.Array, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean -log p(tokens[t] | tokens[<t]) over positions t with mask[t] (t >= 1).

    logits: [B, L-1, V] from tokens[:, :-1]; tokens, mask: [B, L].
    """
    target_logp = losses.token_logprobs(logits, tokens[:, 1:])  # [B, L-1]
    m = mask[:, 1:].astype(jnp.float32)
    return -(target_logp * m).sum() / jnp.maximum(m.sum(), 1.0)


def train_sft(
    cfg: Any,
    examples: Sequence[SFTExample],
    *,
    workdir: str,
    steps: int,
    learning_rate: float,
    batch_size: int,
    seed: int = 0,
    weight_decay: float = 0.0,
    init_from: str = "",
    name: str = "student",
    progress: bool = True,
) -> SFTResult:
    """Trains (or loads from the cache) a Qwen3 on the examples' assistant tokens.

    Args:
      cfg: architecture (random init from `seed` unless `init_from` names an HF directory).
      examples: rendered demonstrations.
      workdir: run directory; the model is cached under workdir/sft/<name>-<hash>/.
      steps, learning_rate, batch_size, weight_decay: AdamW with warmup-cosine decay,
        global-norm clipping at 1.
      seed: initialization and batch order.
      init_from: optional HF checkpoint directory to start from (keyed by its path).
      name: cache entry prefix, e.g. "student" or "teacher".
      progress: show a tqdm bar.
    """
    hparams = {
        "steps": steps,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "seed": seed,
        "weight_decay": weight_decay,
        "init_from": os.path.abspath(init_from) if init_from else "",
    }
    path = os.path.join(workdir, "sft", f"{name}-{cache_key(cfg, examples, hparams)[:16]}")
    log_path = os.path.join(path, LOG_FILE)
    if os.path.exists(log_path):
        with open(log_path) as f:
            log = json.load(f)
        return SFTResult(auto.from_pretrained(path), log["losses"], True, path)

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    if init_from:
        model = auto.from_pretrained(init_from)
    else:
        model = auto.build(cfg, rngs=nnx.Rngs(seed))
    tokens, mask = pad_examples(examples)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    optimizer = _sft_optimizer(steps, learning_rate, weight_decay)
    opt_state = optimizer.init(params)
    train_step = _sft_step(graphdef, rest, optimizer)

    rng = np.random.default_rng(seed)
    order = np.concatenate(
        [rng.permutation(len(tokens)) for _ in range(-(-steps * batch_size // len(tokens)))]
    )
    losses = []
    bar = tqdm(range(steps), desc=f"sft {name}", disable=not progress, leave=False)
    for step in bar:
        idx = order[step * batch_size : (step + 1) * batch_size]
        params, opt_state, loss = train_step(params, opt_state, tokens[idx], mask[idx])
        losses.append(loss)
        if step % 10 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{float(loss):.3f}")
    losses = [float(x) for x in jax.device_get(losses)]
    nnx.update(model, params)
    _save_atomically(model, path, dict(losses=losses, hparams=hparams, examples=len(examples)))
    return SFTResult(model, losses, False, path)


def _sft_optimizer(steps: int, learning_rate: float, weight_decay: float):
    """AdamW with a 10% warmup and cosine decay to a tenth, global-norm clipping at 1."""
    warmup = max(1, steps // 10)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warmup, max(steps, warmup + 1), end_value=learning_rate * 0.1
    )
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=weight_decay)
    )


def _sft_step(graphdef, rest, optimizer):
    """The jitted step (params, opt state, tokens, mask) -> (params, opt state, loss)."""

    def loss_fn(p, batch_tokens, batch_mask):
        logits = nnx.merge(graphdef, p, rest)(batch_tokens[:, :-1])
        return next_token_loss(logits, batch_tokens, batch_mask)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(p, state, batch_tokens, batch_mask):
        loss, grads = jax.value_and_grad(loss_fn)(p, batch_tokens, batch_mask)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    return train_step


def train_sft_from_config(
    config,
    examples: Sequence[SFTExample],
    workdir: str,
    name: str = "student",
    model_section=None,
    progress: bool = True,
) -> SFTResult:
    """`train_sft` with hyperparameters from `config.sft` (steps, learning_rate, batch_size)
    and `config.seed`, and the architecture from `model_section` (default `config.model`;
    pass e.g. a teacher's model section to warm-start the teacher)."""
    model_section = config.model if model_section is None else model_section
    cfg = auto.config_from_section(model_section)
    return train_sft(
        cfg,
        examples,
        workdir=workdir,
        steps=int(config.sft.steps),
        learning_rate=float(config.sft.learning_rate),
        batch_size=int(config.sft.batch_size),
        seed=int(config.seed),
        init_from=str(model_section.get("checkpoint", "") or ""),
        name=name,
        progress=progress,
    )


def _save_atomically(model: nnx.Module, path: str, log: dict) -> None:
    """Writes the HF directory next to `path` and renames it, so a crash leaves no half cache."""
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-")
    try:
        auto.save_pretrained(model, tmp)
        with open(os.path.join(tmp, LOG_FILE), "w") as f:
            json.dump(log, f)
        if os.path.exists(path):  # another process finished the same entry first
            shutil.rmtree(tmp)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
