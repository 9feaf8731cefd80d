"""How the decoder layers run: a Python loop (one compiled copy per layer) or one `lax.scan`.

`Qwen3.scan_layers` compiles ONE layer body for any depth (a 64-layer recipe's score-gradient
program compiles in a fraction of the unrolled time). The parameters keep their per-layer
layout (`layers/0/self_attn/q_proj/kernel`, ...), which HF IO, LoRA, the sharding rules, the
checkpoints and the engine read; the scanned forward stacks the layers' states into [L, ...]
arrays inside the traced program and scans one layer's graphdef over them. The price is that
copy: XLA holds a stacked copy of the layer weights through the forward and backward, and the
scan's backward writes the layers' weight gradients into a stacked [L, ...] array before they
are split back per layer (`learner.memory` counts both). Natively stacked params (levanter's
`Stacked`, MaxText's `scan_layers`) would avoid the copy but change every consumer's paths.

Remat under the scan is the body's `jax.checkpoint`: the scan keeps each layer's input as
its residual (on the device, or with `remat_offload` named "layer_input" and saved to pinned
host memory), and the backward rebuilds one layer at a time.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

__all__ = ["OFFLOAD_LAYER_INPUTS", "offloaded_layers", "run_layer", "scan_layers", "stack_layers"]


def run_layer(layer, x, positions, visible, cache_layer):
    return layer(x, positions, visible, cache_layer)


# remat_offload: the only residuals kept between forward and backward are the layer inputs,
# and they go to pinned host memory; each layer is rematerialized on the device in turn.
OFFLOAD_LAYER_INPUTS = jax.checkpoint_policies.save_and_offload_only_these_names(
    names_which_can_be_saved=(),
    names_which_can_be_offloaded=("layer_input",),
    offload_src="device",
    offload_dst="pinned_host",
)


def offloaded_layers(layers, x, positions, visible):
    """The unrolled loop with offloaded layer inputs (call under nnx.remat(OFFLOAD_...))."""
    run = nnx.remat(run_layer)
    for layer in layers:
        x, _ = run(layer, checkpoint_name(x, "layer_input"), positions, visible, None)
    return x


def stack_layers(layers) -> tuple[nnx.GraphDef, Any]:
    """(one layer's graphdef, every layer's state stacked on a new leading [L] axis)."""
    graphdef = nnx.graphdef(layers[0])
    states = [nnx.state(layer) for layer in layers]
    # tree.map is strict about structure: layers that differ (not one repeated body) raise.
    return graphdef, jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)


def _checkpointed(body, remat: bool, offload: bool):
    if not remat:
        return body
    if not offload:
        return jax.checkpoint(body)

    def named_input(x, *rest):
        return body(checkpoint_name(x, "layer_input"), *rest)

    return jax.checkpoint(named_input, policy=OFFLOAD_LAYER_INPUTS)


def scan_layers(layers, x, step, *, remat: bool, offload: bool, per_layer=()):
    """Runs `step(layer, x, *per_layer_slices) -> (x, out)` over `layers` in one lax.scan.

    Args:
      layers: the decoder layers (identical modules; their states are stacked).
      x: the carry (the residual stream [B, T, D]).
      step: one layer's computation; `layer` is an nnx module merged from the scanned slice.
      remat: rematerialize each layer in the backward (only its input is kept).
      offload: with remat, keep the layer inputs in pinned host memory.
      per_layer: arrays with a leading [L] axis sliced alongside the layers (e.g. past keys).

    Returns:
      (final carry, `out` of every layer stacked on a leading [L] axis).
    """
    graphdef, stacked = stack_layers(layers)

    def body(x, state, *slices):
        return step(nnx.merge(graphdef, state), x, *slices)

    body = _checkpointed(body, remat, offload)
    return jax.lax.scan(lambda x, xs: body(x, *xs), x, (stacked, *per_layer))
