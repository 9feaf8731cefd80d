"""`--dry_run`: compile the learner of a GPU config on fake CPU devices, allocate nothing.

    python -m experiments.swe_grpo --config=configs/b200.py:full --dry_run

Builds the learner mesh of `config.mesh` on fsdp·tp fake CPU devices, abstract params in
`model.param_dtype` with their NamedShardings (`jax.eval_shape`: no weights exist), then
lowers and compiles, at the config's shapes and shardings, the two programs every step
runs: the score-gradient chunk (the longest bucket, `node.chunk_rows` rows split over
"fsdp") and the optimizer update (state donated). It prints the memory planner's per-device
GB beside each compiled program's argument / output / temporary bytes and returns 0 when
the planner says the learner fits.

The verdict is the planner's (`learner/memory.py`), labelled as such: XLA's CPU memory
analysis does not model GPU buffer assignment (it reported ~1 TB of temporaries for one
27B-shape gradient, see issue 18), so on CPU the dry run proves that shapes and shardings
compile, and the planner sizes the device.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from thundersync_jax import gpu_node
from thundersync_jax.learner import buckets, chunks, memory, model_state
from thundersync_jax.learner import mesh as mesh_lib
from thundersync_jax.learner import train_state as ts
from thundersync_jax.models import auto, lora, qwen3, sharding

GB = 1e9
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
# Nothing compiled here ever runs: skip the CPU backend's optimizations (compile time only).
_COMPILE_ONLY_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)


def use_fake_cpu_devices(count: int) -> None:
    """Makes jax see `count` CPU devices; re-executes this process if jax already started.

    XLA reads the device-count flag once, when the first backend starts; after that the only
    way to change it is a fresh process with the flag in its environment.
    """
    given = os.environ.get("XLA_FLAGS", "").split()
    # A larger fake-device count already asked for (e.g. 8) is kept; the mesh takes the first.
    counts = [int(f.split("=")[1]) for f in given if f.startswith(_DEVICE_FLAG + "=")]
    count = max([count, *counts])
    ours = (_DEVICE_FLAG, *(f.split("=")[0] for f in _COMPILE_ONLY_FLAGS))
    flags = [f for f in given if f.split("=")[0] not in ours]
    wanted = " ".join([*flags, f"{_DEVICE_FLAG}={count}", *_COMPILE_ONLY_FLAGS])
    if gpu_node.backends_started():
        if jax.default_backend() == "cpu" and len(jax.devices()) >= count:
            return
        env = dict(os.environ, XLA_FLAGS=wanted, JAX_PLATFORMS="cpu")
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    os.environ["XLA_FLAGS"] = wanted
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")


@dataclasses.dataclass(frozen=True)
class Compiled:
    """Per-device bytes XLA reports for one compiled program, and its compile time."""

    name: str
    arguments: int
    outputs: int
    temporaries: int
    seconds: float

    @classmethod
    def of(cls, name: str, lowered: Any) -> Compiled:
        start = time.perf_counter()
        stats = lowered.compile().memory_analysis()
        return cls(
            name,
            int(stats.argument_size_in_bytes),
            int(stats.output_size_in_bytes),
            int(stats.temp_size_in_bytes),
            time.perf_counter() - start,
        )


def _abstract(tree: Any, shardings: Any) -> Any:
    return model_state.with_shardings(jax.eval_shape(lambda t: t, tree), shardings)


def _chunk_shape(config: Any, mesh) -> tuple[int, int]:
    node = config.get("node")
    rows = buckets.bucket_rows(int(node.chunk_rows) if node is not None else 1)
    rows += -rows % int(mesh.shape["fsdp"])  # as `chunks.place_rows` pads them
    length = buckets.bucket_length(int(config.rollout.max_traj_tokens), config.learner.seq_buckets)
    return rows, length


def compile_learner(config: Any) -> tuple[list[Compiled], tuple[int, int]]:
    """Lowers and compiles the score-gradient chunk and the update of `config` (abstract)."""
    mesh = mesh_lib.learner_mesh(config.mesh)
    cfg = model_state.model_config(config)
    graphdef, abstract = model_state.abstract_model(config, cfg)
    param_sh = sharding.param_shardings(abstract, sharding.rules_from_config(config.mesh), mesh)
    params = model_state.with_shardings(abstract, param_sh)
    if config.lora.enabled:
        c = config.lora
        trainable = jax.eval_shape(
            lambda p: lora.init(
                p, int(c.rank), float(c.alpha), tuple(c.targets), key=jax.random.key(0)
            ),
            params,
        )
        trainable_sh = sharding.replicated(trainable, mesh)
        base = params
    else:
        trainable, trainable_sh, base = params, param_sh, None
    trainable = _abstract(trainable, trainable_sh)
    rows, length = _chunk_shape(config, mesh)
    row_sh = mesh_lib.batch_sharding(mesh)
    tokens = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=row_sh)
    weights = jax.ShapeDtypeStruct((rows, length), jnp.float32, sharding=row_sh)
    score = chunks.make_score_grad_fn(
        graphdef,
        tuple(config.learner.seq_buckets),
        remat=bool(config.model.remat),
        lora=base is not None,
        out_shardings=trainable_sh,
        rows=row_sh,
    )
    grad_program = Compiled.of(
        f"score gradient [{rows} x {length}]",
        score.lower(trainable, base, tokens, weights, weights),
    )
    optimizer = ts.make_optimizer(config.optim)
    abstract_state = jax.eval_shape(lambda t: ts.init_train_state(t, optimizer, 0), trainable)
    state_sh = ts.state_shardings(abstract_state, trainable_sh, mesh_lib.replicated(mesh))
    state = model_state.with_shardings(abstract_state, state_sh)
    grads = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=a.sharding), trainable
    )
    apply = ts.make_apply_update(optimizer, bool(config.optim.skip_zero_grad))
    update_program = Compiled.of("optimizer update", apply.lower(state, grads))
    if any(auto.layer_pattern(cfg)):
        # The per-turn segment programs run the dense decoder (`qwen3.segment_hidden_states`);
        # MoE models train whole trajectories (OPD at `trajectory` granularity, no shared
        # prompts), so there is no segment program to compile.
        return [grad_program, update_program], (rows, length)
    seg = min(SEGMENT_TOKENS, length)
    segment_program = Compiled.of(
        f"segment gradient [{seg} new vs {length} cached]",
        segment_step(graphdef, base is not None).lower(
            trainable, base, *segment_arguments(cfg, length, seg, config.model.dtype)
        ),
    )
    return [grad_program, segment_program, update_program], (rows, length)


SEGMENT_TOKENS = 1024  # new tokens of the dry run's (and the probe's) segment step


def segment_arguments(cfg: Any, cache_tokens: int, new_tokens: int, dtype: Any) -> tuple:
    """Abstract (past_k, past_v, past_valid, ids, positions, targets) of one segment row."""
    kv = (cfg.num_hidden_layers, 1, cache_tokens, cfg.num_key_value_heads, cfg.head_dim)
    ids = jax.ShapeDtypeStruct((1, new_tokens), jnp.int32)
    past = jax.ShapeDtypeStruct(kv, jnp.dtype(dtype))
    return past, past, jax.ShapeDtypeStruct((1, cache_tokens), bool), ids, ids, ids


def segment_step(graphdef: Any, use_lora: bool) -> Any:
    """Jitted gradient of one segment (new tokens against a cache) for the params and the cache.

    The shape of the learner's per-turn segment programs (`segment_programs`): segment forward
    over [cache, new] keys, tiled log-probs, gradient for the trainable params and the cached
    keys/values, the segment's own keys/values given a cotangent too.
    """

    def grads(trainable, base, past_k, past_v, past_valid, ids, positions, targets):
        def objective(trainable, past_k, past_v):
            full = lora.merge(jax.lax.stop_gradient(base), trainable) if use_lora else trainable
            model = nnx.merge(graphdef, full)
            out = qwen3.segment_hidden_states(
                model, ids, positions, jnp.ones(ids.shape, bool), past_k, past_v, past_valid
            )
            logp, _ = model.token_terms(out.hidden, targets)
            own = jnp.sum(out.k.astype(jnp.float32)) + jnp.sum(out.v.astype(jnp.float32))
            return jnp.sum(logp) + 1e-3 * own

        return jax.grad(objective, argnums=(0, 1, 2))(trainable, past_k, past_v)

    return jax.jit(grads)


def report(config: Any) -> tuple[str, bool]:
    """The dry run's text and whether the planner says the learner fits (True without a node)."""
    start = time.perf_counter()
    programs, (rows, length) = compile_learner(config)
    lines = [
        f"dry run: mesh fsdp={config.mesh.fsdp} x tp={config.mesh.tp} over the first "
        f"{int(config.mesh.fsdp) * int(config.mesh.tp)} of {len(jax.devices())} fake CPU devices, "
        f"model.param_dtype={config.model.param_dtype}, dtype={config.model.dtype}, "
        f"remat={bool(config.model.remat)}, scan_layers={bool(config.model.scan_layers)}, "
        f"lora={bool(config.lora.enabled)}",
        "",
        "| compiled program (XLA CPU, per device) | arguments GB | outputs GB | temps GB | "
        "compile s |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in programs:
        lines.append(
            f"| {p.name} | {p.arguments / GB:.2f} | {p.outputs / GB:.2f} | "
            f"{p.temporaries / GB:.2f} | {p.seconds:.1f} |"
        )
    lines.append(
        "(XLA's CPU memory analysis does not model GPU buffer assignment; temporaries "
        "here are not a GPU prediction.)"
    )
    if not any(p.name.startswith("segment") for p in programs):
        lines.append("no segment program: MoE models train whole trajectories (no segments)")
    fits = True
    if config.get("node") is not None:
        plan = memory.plan(config)
        fits = plan.fits
        lines += ["", "memory planner (learner/memory.py), per learner device:", plan.table()]
        lines.append(
            f"planner verdict: {'fits' if fits else 'DOES NOT FIT'} "
            f"({plan.total / GB:.1f} of {plan.capacity / GB:.1f} GB usable)"
        )
    else:
        lines.append("no `node` section: no device budget to check (planner skipped)")
    lines.append(f"dry run took {time.perf_counter() - start:.1f} s")
    return "\n".join(lines), fits


def main(config: Any) -> int:
    """Runs the dry run for `config` (fake devices first); prints the report; exit status."""
    use_fake_cpu_devices(int(config.mesh.fsdp) * int(config.mesh.tp))
    text, fits = report(config)
    print(text, flush=True)
    return 0 if fits else 1
