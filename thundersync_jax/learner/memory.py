"""Per-device memory plan of the learner (and rollout weights) from a run config.

Counts, per learner device:
  params       the model weights in `param_dtype`, sharded by the config's mesh rules;
  grads        one transient float32 score gradient h (trainable-sized);
  optimizer    adamw: two float32 moments (trainable-sized);
  tallies      accumulator tallies, float32: 1 global + 2 per open group (the affine / two
               reward-bucket form), sharded like the params, so divided by the data-parallel size;
               0 with `accum.placement="host"`, where they live in host memory instead;
  staging      host placement only: the chunk's increment w·h (float32, trainable-sized), made
               on the device and copied to host memory while h may still be alive;
  lora_merged  LoRA only: the merged copy of the targeted weights the forward reads;
  scan_copies  `model.scan_layers`: the scanned forward's stacked copy of the decoder layers'
               weights and the backward's stacked [L, ...] gradient of them (param dtype; for
               LoRA the merged weights' gradient), 2 x the layer params per device;
  activations  one chunk's forward+backward working set (estimate, see `activation_bytes`);
  segments     OPD at `turn` granularity: every open trajectory's learner KV cache (cache
               dtype) and its K/V cotangent buffers (float32), at the capacity of the longest
               trajectory, times the open trajectories (`rl.max_open_trajectories`, else the
               batch's K·G members); exact (`learner.segments.Trajectory.nbytes`).

Param shards are exact (shapes from `jax.eval_shape` of the real model, split by the same
logical rules as `sharding.param_specs`); activations are an estimate of the tensors XLA keeps
for the backward pass (`learner.activations`: linear in T on the blockwise / flash attention
and tiled log-prob paths), good to a small factor, and meant to choose mesh, remat and bucket
sizes, not to replace a device measurement.

And, per learner process (host memory, `node.host_memory_gb` x `node.host_memory_headroom`):
  host_tallies   the same 1 + 2·M tallies for all of the process's devices when
                 `accum.placement="host"` (0 otherwise);
  host_snapshot  the bf16 weight snapshot the process publishes to its engines in /dev/shm;
  host_activations  `model.remat_offload`: every layer's input of one chunk, for each of the
                 process's devices (the remat residuals offloaded to pinned host memory).
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from thundersync_jax import accumulators
from thundersync_jax.learner import buckets
from thundersync_jax.learner.activations import activation_bytes, layer_inputs_bytes
from thundersync_jax.models import auto, lora, sharding
from thundersync_jax.schedule import schedules

GB = 1e9
_F32 = 4


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes of one learner device, and what one rollout device holds.

    Attributes:
      params, grads, optimizer, tallies, lora_merged, activations, segments, scan_copies: bytes
        per learner device.
      staging: bytes per learner device of the w·h copied to host (host placement; else 0).
      capacity: usable bytes per device (gpu_memory_gb · memory_headroom).
      num_params: model parameters; trainable_params: what gradients cover (adapters for LoRA).
      open_group_tallies: tallies per open group times open groups kept on the device.
      chunk_tokens: padded sequence length of the largest chunk.
      rollout_weights: bytes of bf16 weights per rollout device (tensor parallel over rollout_tp).
      open_trajectories: OPD trajectories whose caches `segments` counts.
      placement: where the tallies live, "device" or "host" (`accum.placement`).
      host_tallies: host bytes of tallies per learner process (0 with device placement).
      host_snapshot: host bytes of the /dev/shm weight snapshot per learner process.
      host_capacity: usable host bytes per process (host_memory_gb · host_memory_headroom);
        None when the node does not give host_memory_gb (then host memory is not checked).
    """

    params: int
    grads: int
    optimizer: int
    tallies: int
    lora_merged: int
    activations: int
    capacity: int
    num_params: int
    trainable_params: int
    open_group_tallies: int
    chunk_tokens: int
    rollout_weights: int
    segments: int = 0
    scan_copies: int = 0
    open_trajectories: int = 0
    placement: str = "device"
    staging: int = 0
    host_tallies: int = 0
    host_snapshot: int = 0
    host_capacity: int | None = None
    host_activations: int = 0

    @property
    def host_total(self) -> int:
        return self.host_tallies + self.host_snapshot + self.host_activations

    @property
    def host_fits(self) -> bool:
        return self.host_capacity is None or self.host_total <= self.host_capacity

    @property
    def total(self) -> int:
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.tallies
            + self.staging
            + self.lora_merged
            + self.activations
            + self.segments
            + self.scan_copies
        )

    @property
    def fits(self) -> bool:
        device = self.total <= self.capacity and self.rollout_weights <= self.capacity
        return device and self.host_fits

    def table(self) -> str:
        """Markdown table in GB per device."""
        rows = [
            ("params", self.params),
            ("grads (h, f32)", self.grads),
            ("optimizer (adamw, f32)", self.optimizer),
            (f"tallies (1 + {self.open_group_tallies}, f32)", self.tallies),
            ("w·h staged for the host (f32)", self.staging),
            ("lora merged weights", self.lora_merged),
            (f"activations ({self.chunk_tokens} tokens)", self.activations),
            (f"segment caches ({self.open_trajectories} trajectories)", self.segments),
            ("scanned layers: stacked weights + gradient", self.scan_copies),
            ("total learner", self.total),
            ("capacity", self.capacity),
            ("rollout weights", self.rollout_weights),
        ]
        lines = [f"| per device (tallies on {self.placement}) | GB |", "|---|---:|"]
        lines += [f"| {name} | {value / GB:.1f} |" for name, value in rows]
        host = [
            (f"tallies (1 + {self.open_group_tallies}, f32)", self.host_tallies),
            ("weight snapshot (/dev/shm, bf16)", self.host_snapshot),
            ("offloaded layer inputs (remat_offload)", self.host_activations),
            ("total host", self.host_total),
            ("host capacity", self.host_capacity),
        ]
        lines += ["", "| per learner process, host memory | GB |", "|---|---:|"]
        lines += [
            f"| {name} | {'not given' if value is None else f'{value / GB:.1f}'} |"
            for name, value in host
        ]
        return "\n".join(lines)


def _dtype_bytes(name: str) -> int:
    return jnp.dtype(name).itemsize


def abstract_params(model_config: Any, pattern: tuple[bool, ...] | None = None) -> Any:
    """Param shapes (`jax.ShapeDtypeStruct`s in an nnx.State) of the configured model; with
    `pattern`, of a model with those layers only (True = a sparse MoE layer)."""
    cfg = auto.config_from_section(model_config)
    if pattern is not None:
        cfg = auto.with_layer_pattern(cfg, pattern)
    dtype = jnp.dtype(model_config.param_dtype)
    model = nnx.eval_shape(lambda: auto.build(cfg, param_dtype=dtype))
    return nnx.split(model, nnx.Param)[1]


def layer_kinds(model_config: Any) -> tuple[tuple[bool, ...], tuple[int, ...]]:
    """(one layer of each kind, how many layers of that kind): dense (False), sparse (True)."""
    pattern = auto.layer_pattern(auto.config_from_section(model_config))
    kinds = tuple(sorted(set(pattern)))
    return kinds, tuple(pattern.count(k) for k in kinds)


def _shard_ways(spec, mesh_shape: dict[str, int]) -> int:
    ways = 1
    for entry in spec:
        for axis in (entry,) if isinstance(entry, str) else (entry or ()):
            ways *= mesh_shape[axis]
    return ways


def param_shard_elements(config: Any) -> tuple[int, int, int]:
    """(total params, params per device, targeted-by-LoRA params per device, decoder-layer
    params per device) under the rules."""
    # Decoder layers of one kind (dense, or MoE) are identical, so one layer of each kind
    # stands for all of them: tracing the init of a 64-layer model costs seconds to minutes,
    # one layer costs milliseconds.
    kinds, counts = layer_kinds(config.model)
    abstract = abstract_params(config.model, kinds)
    mesh_shape = {"fsdp": int(config.mesh.fsdp), "tp": int(config.mesh.tp)}
    # The specs only need the axis sizes, so no devices are required.
    mesh = types.SimpleNamespace(shape=mesh_shape)
    specs = sharding.param_specs(abstract, sharding.rules_from_config(config.mesh), mesh)
    targets = tuple(config.lora.targets)
    total = per_device = targeted = in_layers = 0
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    flat_params = jax.tree_util.tree_leaves_with_path(abstract)
    for (keypath, leaf), spec in zip(flat_params, flat_specs, strict=True):
        path = [str(getattr(k, "key", getattr(k, "name", k))) for k in keypath]
        copies = counts[int(path[1])] if path[0] == "layers" else 1
        size = math.prod(leaf.shape) * copies
        local = size // _shard_ways(spec, mesh_shape)
        total += size
        per_device += local
        if leaf.ndim >= 2 and any(p in targets for p in path):
            targeted += local
        if path[0] == "layers":
            in_layers += local
    return total, per_device, targeted, in_layers


def lora_params(model_config: Any, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters: rank · (in + out) per targeted weight per layer (and per expert)."""
    if model_config.get("model_type", "qwen3") not in ("qwen3", "qwen2"):
        kinds, counts = layer_kinds(model_config)
        total = 0
        for path, lay in lora.find_layouts(abstract_params(model_config, kinds), targets):
            parts = path.split("/")
            copies = counts[int(parts[1])] if parts[0] == "layers" else 1
            total += (
                copies * math.prod(lay.batch_shape) * rank * (lay.in_features + lay.out_features)
            )
        return total
    d, f = model_config.hidden_size, model_config.intermediate_size
    q = model_config.num_attention_heads * model_config.head_dim
    kv = model_config.num_key_value_heads * model_config.head_dim
    sizes = {
        "q_proj": d + q,
        "k_proj": d + kv,
        "v_proj": d + kv,
        "o_proj": q + d,
        "gate_proj": d + f,
        "up_proj": d + f,
        "down_proj": f + d,
    }
    return model_config.num_hidden_layers * rank * sum(sizes[t] for t in targets)


def open_groups_kept(config: Any) -> int:
    """Open groups with live tallies (device or host; 0 when groups close before work)."""
    if config.rl.algorithm == "opd":
        return 0  # OPD's accumulator has one global tally, no per-group ones
    return schedules.get(config.schedule).open_group_tallies(
        int(config.rl.num_groups), int(config.rl.max_open_groups) or None
    )


def open_trajectories_on_device(config: Any) -> int:
    """OPD trajectories whose learner caches are kept at once (0: none kept)."""
    if config.rl.algorithm != "opd" or config.rl.opd_granularity == "trajectory":
        return 0  # `auto` may pick `turn`: planned for the larger of the two
    cap = int(config.rl.max_open_trajectories)
    members = int(config.rl.num_groups) * int(config.rl.group_size)
    return min(cap, members) if cap else members


def segment_cache_bytes(model_config: Any, capacity: int) -> int:
    """One open trajectory: K, V in the compute dtype and dK, dV in float32, [L, S, K, H] each
    (MLA: the compressed cache, latent + rope key per token and layer)."""
    m = model_config
    cfg = auto.config_from_section(m)
    if cfg.model_type == "glm4_moe_lite":
        per_slot = cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) / 2
    else:
        per_slot = cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    return int(capacity * per_slot * 2 * (_dtype_bytes(m.dtype) + _F32))


def _host_capacity(node: Any) -> int | None:
    if not float(node.host_memory_gb):
        return None
    return int(float(node.host_memory_gb) * GB * float(node.host_memory_headroom))


def plan(config: Any) -> MemoryPlan:
    """Memory plan for `config` (a configs/*.py ConfigDict with a `node` section)."""
    node = config.node
    learner_devices = int(config.mesh.fsdp) * int(config.mesh.tp)
    if learner_devices != int(node.learner_gpus):
        raise ValueError(
            f"mesh fsdp={config.mesh.fsdp} x tp={config.mesh.tp} = {learner_devices} devices, "
            f"but node.learner_gpus={node.learner_gpus}"
        )
    if int(node.rollout_gpus) + int(node.learner_gpus) > int(node.num_gpus):
        raise ValueError(
            f"rollout_gpus={node.rollout_gpus} + learner_gpus={node.learner_gpus} exceed "
            f"num_gpus={node.num_gpus}"
        )
    total, params_local, targeted_local, layers_local = param_shard_elements(config)
    param_bytes = _dtype_bytes(config.model.param_dtype)
    if config.lora.enabled:
        trainable = lora_params(config.model, int(config.lora.rank), tuple(config.lora.targets))
        trainable_local = trainable  # adapters are replicated (they are small)
        merged = targeted_local * param_bytes
    else:
        trainable, trainable_local, merged = total, params_local, 0
    open_tallies = 2 * open_groups_kept(config)
    placement = accumulators.tally_placement(config)
    tally_bytes = (1 + open_tallies) * trainable_local * _F32
    chunk_tokens = buckets.bucket_length(
        int(config.rollout.max_traj_tokens), config.learner.seq_buckets
    )
    activations = activation_bytes(
        config.model,
        int(node.chunk_rows),
        chunk_tokens,
        int(config.mesh.tp),
        bool(config.model.remat),
    )
    return MemoryPlan(
        params=params_local * param_bytes,
        grads=trainable_local * _F32,
        optimizer=2 * trainable_local * _F32,
        tallies=0 if placement == "host" else tally_bytes,
        lora_merged=merged,
        activations=activations,
        capacity=int(float(node.gpu_memory_gb) * GB * float(node.memory_headroom)),
        num_params=total,
        trainable_params=trainable,
        open_group_tallies=open_tallies,
        chunk_tokens=chunk_tokens,
        rollout_weights=total * 2 // int(node.rollout_tp),
        # The cache capacity is the trajectory's bucket (`segments.SegmentFns.open`).
        scan_copies=2 * layers_local * param_bytes if config.model.scan_layers else 0,
        segments=open_trajectories_on_device(config)
        * segment_cache_bytes(config.model, chunk_tokens),
        open_trajectories=open_trajectories_on_device(config),
        placement=placement,
        staging=trainable_local * _F32 if placement == "host" else 0,
        host_tallies=tally_bytes * learner_devices if placement == "host" else 0,
        host_snapshot=total * 2,
        host_capacity=_host_capacity(node),
        host_activations=learner_devices
        * layer_inputs_bytes(config.model, int(node.chunk_rows), chunk_tokens)
        if config.model.remat and config.model.remat_offload
        else 0,
    )


def main(argv: Any) -> None:
    """`python -m thundersync_jax.learner.memory --config=configs/b200.py:full` prints the plan."""
    del argv
    result = plan(_CONFIG.value)
    print(result.table())
    print(f"fits: {result.fits}")


if __name__ == "__main__":
    from absl import app
    from ml_collections import config_flags

    _CONFIG = config_flags.DEFINE_config_file("config", None, "run config file", lock_config=True)
    app.run(main)
