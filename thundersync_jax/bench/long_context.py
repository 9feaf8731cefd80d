"""Compiled memory of the learner's programs vs trajectory length (compile only, runs nothing).

    python -m thundersync_jax.bench.long_context --tokens=4096,16384,65536 \\
        --hidden=256 --layers=2 --heads=4 --kv_heads=2 --head_dim=64 --vocab=151936 [--naive]

For a Qwen3 of the given dimensions (abstract parameters: nothing is allocated), lowers and
compiles, for each length T, one row of:
  * the score-gradient chunk (`learner.chunks.ScoreGradFn`: forward over T tokens, tiled
    log-probs, gradient of Σ w·log π, per-layer remat), and
  * a segment step: 1,024 new tokens against a cache of T tokens (the segment forward of
    `models.qwen3`'s segments, tiled log-probs, gradient for the params and the cache),
and prints one JSON line per length with the compiled programs' `memory_analysis()`:
{"tokens", "temp_bytes", "argument_bytes", "output_bytes", "segment_temp_bytes"}.
`--naive` does the same with the reference paths ([T, S] attention scores, whole [T, V]
logits) for comparison. CPU compile times stay flat in T (blockwise loops, token tiles).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax.learner import chunks, dry_run
from thundersync_jax.models import qwen3


def abstract_model(args) -> tuple[qwen3.Qwen3Config, nnx.GraphDef, nnx.State]:
    """(config, graphdef, abstract params) of the probe's model; paths follow `args.naive`."""
    cfg = qwen3.Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.mlp or 3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        tie_word_embeddings=False,
    )
    dtype = jnp.dtype(args.dtype)
    model = nnx.eval_shape(
        lambda: qwen3.Qwen3(
            cfg,
            dtype=dtype,
            param_dtype=dtype,
            remat=True,
            attention_impl="naive" if args.naive else args.impl,
            attention_block=args.block,
            logits_tile=0 if args.naive else args.tile,
            rngs=nnx.Rngs(0),
        )
    )
    return (cfg, *nnx.split(model, nnx.Param))


def score_grad_memory(graphdef, params, tokens: int):
    """The compiled score-gradient chunk of one row of `tokens` tokens."""
    fn = chunks.ScoreGradFn(graphdef, (tokens,), remat=True)
    ints = jax.ShapeDtypeStruct((1, tokens), jnp.int32)
    floats = jax.ShapeDtypeStruct((1, tokens), jnp.float32)
    return fn.lower(params, None, ints, floats, floats).compile().memory_analysis()


def segment_memory(cfg, graphdef, params, cache_tokens: int, dtype):
    """The compiled gradient of one segment of 1,024 tokens against `cache_tokens` slots."""
    args = dry_run.segment_arguments(cfg, cache_tokens, dry_run.SEGMENT_TOKENS, dtype)
    lowered = dry_run.segment_step(graphdef, use_lora=False).lower(params, None, *args)
    return lowered.compile().memory_analysis()


def probe(args, tokens: int, cfg, graphdef, params) -> dict:
    t0 = time.perf_counter()
    chunk = score_grad_memory(graphdef, params, tokens)
    seg = segment_memory(cfg, graphdef, params, tokens, jnp.dtype(args.dtype))
    return {
        "tokens": tokens,
        "temp_bytes": int(chunk.temp_size_in_bytes),
        "argument_bytes": int(chunk.argument_size_in_bytes),
        "output_bytes": int(chunk.output_size_in_bytes),
        "segment_temp_bytes": int(seg.temp_size_in_bytes),
        "naive": bool(args.naive),
        "compile_s": round(time.perf_counter() - t0, 2),
    }


def step_times(args, tokens: int, repeats: int) -> dict:
    """Median seconds of the score-gradient chunk, new vs naive paths, runs interleaved."""
    fns = {}
    rng = np.random.default_rng(0)
    for naive in (False, True):  # the same params (one tree structure) on both paths
        args.naive = naive
        cfg, graphdef, abstract = abstract_model(args)
        if not naive:
            params = jax.tree.map(lambda x: rng.normal(0, 0.02, x.shape).astype(x.dtype), abstract)
        fns[naive] = (chunks.ScoreGradFn(graphdef, (tokens,), remat=True), params)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, tokens), np.int32)
    mask = np.ones((1, tokens), np.float32)
    mask[:, 0] = 0
    times = {False: [], True: []}
    for i in range(repeats + 1):  # the first round compiles
        for naive, (fn, params) in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(params, ids, mask)[0])
            if i:
                times[naive].append(time.perf_counter() - t)
    new, old = float(np.median(times[False])), float(np.median(times[True]))
    return {"tokens": tokens, "new_s": new, "naive_s": old, "new_over_naive": new / old}


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", required=True, help="comma-separated lengths, e.g. 4096,16384")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--mlp", type=int, default=0, help="MLP width (default 3 x hidden)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv_heads", type=int, default=2)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--impl", default="blockwise", help="attention impl unless --naive")
    ap.add_argument("--block", type=int, default=512, help="blockwise attention block")
    ap.add_argument("--tile", type=int, default=1024, help="log-prob token tile")
    ap.add_argument("--naive", action="store_true", help="[T, S] scores and [T, V] logits")
    ap.add_argument(
        "--time_steps",
        type=int,
        default=0,
        help="instead: run (random params) new and naive chunks interleaved, N timed rounds",
    )
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.time_steps:
        for tokens in (int(t) for t in args.tokens.split(",")):
            print(json.dumps(step_times(args, tokens, args.time_steps)), flush=True)
        return 0
    dry_run.use_fake_cpu_devices(1)  # compile-only XLA flags (nothing compiled here runs)
    cfg, graphdef, params = abstract_model(args)
    for tokens in (int(t) for t in args.tokens.split(",")):
        print(json.dumps(probe(args, tokens, cfg, graphdef, params)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
