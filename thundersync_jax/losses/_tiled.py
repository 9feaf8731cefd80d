"""Per-token log-probs and entropies from hidden states, in token tiles (never [T, V]).

The LM head, the temperature and the log-softmax run on one tile of tokens at a time under a
`lax.scan` whose body is rematerialized (`jax.checkpoint`): the forward keeps one tile's
float32 logits alive, and the backward recomputes each tile's logits from its hidden states.
Peak memory is one [B, tile, V] tile instead of [B, T, V]; results equal the whole-array
`token_logprobs` / `entropy` (same float32 statistics, same order of operations per token).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

LogitsFn = Callable[[Float[Array, "B t D"]], Float[Array, "B t V"]]


def _tile_terms(logits_fn, temperature, with_entropy, h, y):
    logits = logits_fn(h).astype(jnp.float32)
    if temperature != 1.0:  # as `learner.chunks.tempered`: 1.0 leaves the logits as they are
        logits = logits / jnp.float32(temperature)
    log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, t]
    picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    if not with_entropy:
        return picked - log_z, None
    logp = logits - log_z[..., None]
    return picked - log_z, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def tiled_token_terms(
    hidden: Float[Array, "B T D"],
    logits_fn: LogitsFn,
    targets: Int[Array, "B T"],
    *,
    temperature: float = 1.0,
    tile: int = 1024,
    with_entropy: bool = False,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"] | None]:
    """(log π(targets | ·), entropy or None) of softmax(logits_fn(hidden) / temperature).

    Args:
      hidden: final-norm hidden states; position t predicts targets[:, t].
      logits_fn: the LM head, [B, t, D] -> [B, t, V] (float32 or upcast here).
      targets: int [B, T].
      temperature: the sampling temperature, applied inside each tile.
      tile: tokens per tile (T is padded up to a multiple; the padding is dropped).
      with_entropy: also return each position's entropy in nats.
    """
    b, t, d = hidden.shape
    tile = max(1, min(int(tile), t))
    pad = -t % tile
    n = (t + pad) // tile
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, tile, d).swapaxes(0, 1)
    y = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad))).reshape(b, n, tile).swapaxes(0, 1)
    body = jax.checkpoint(lambda h, y: _tile_terms(logits_fn, temperature, with_entropy, h, y))

    def step(carry, xs):
        return carry, body(*xs)

    _, (logp, ent) = jax.lax.scan(step, None, (h, y))

    def untile(x):
        return x.swapaxes(0, 1).reshape(b, n * tile)[:, :t]

    return untile(logp), None if ent is None else untile(ent)
