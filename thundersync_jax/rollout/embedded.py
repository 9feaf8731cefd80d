"""Embedded JAX engine: the Qwen3 KV-cache sampler with continuous batching.

A fixed number of cache rows (`max_batch`) hold one request each. Every `step`:

1. queued requests are admitted into free rows and prefilled, which also samples their first
   token: one jitted call per prompt-length bucket loops over the admitted prompts only, each
   through the model as a [1, bucket] batch with its own small cache whose keys/values are then
   written into the request's row (the other rows are untouched and cost nothing);
2. one decode call feeds every active row its last token and samples the next;
3. rows whose request hit a stop token, `max_new_tokens` or the end of the row are freed and
   their results returned — other rows keep decoding, and the next step refills the free rows.

Determinism: token t of a request is drawn with `token_key(sequence_key(*key_ids), position)`
(MODEL's sampling), and each row's arithmetic has the same shapes whatever the other rows hold
(prefill [1, bucket(prompt)] per request, decode [R, 1]), so a request gives the same tokens
alone, mixed into any batch, or retried on a restarted engine. Compiles are bounded: one decode
program, one prefill program per bucket, one score program per (rows, bucket). The programs and
the length buckets are in `embedded_programs.py`; this module is the host-side bookkeeping.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from thundersync_jax.models import auto, qwen3, sampling
from thundersync_jax.models import lora as lora_lib
from thundersync_jax.rollout import embedded_programs as programs
from thundersync_jax.rollout import protocol, snapshots
from thundersync_jax.rollout.embedded_programs import bucket_for, length_buckets
from thundersync_jax.rollout.protocol import GenerateRequest, GenerateResult

INITIAL_VERSION = -1
_SCORE_LOGIT_BUDGET = 1 << 26  # floats of [rows, T, V] logits one score call may hold


@dataclasses.dataclass
class _Row:
    request: GenerateRequest
    prompt_len: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    routes: list[np.ndarray] = dataclasses.field(default_factory=list)  # [n_i, M, K] blocks


class EmbeddedEngine:
    """Continuous-batching sampler over a Qwen3 model (implements the server's Backend).

    Args:
      model: the policy (its current weights are version `version`).
      max_batch: cache rows R (requests decoded at once).
      max_seq_len: tokens per row (prompt + generation).
      version: policy version of the initial weights.
      cache_dtype: dtype of the KV cache (default: the model's compute dtype).
      lora: (rank, alpha, targets) when the learner trains LoRA adapters and publishes only
        them (kind "lora_adapters"): the engine keeps its initial weights as the frozen base
        and serves base + adapters. Full or merged snapshots replace the weights as usual.
    """

    def __init__(
        self,
        model: qwen3.Qwen3,
        *,
        max_batch: int = 8,
        max_seq_len: int = 512,
        version: int = INITIAL_VERSION,
        cache_dtype: Any = None,
        lora: tuple[int, float, Sequence[str]] | None = None,
    ):
        if max_batch < 1 or max_seq_len < 2:
            raise ValueError(
                f"need max_batch >= 1 and max_seq_len >= 2, got {max_batch}, {max_seq_len}"
            )
        self.cfg = model.cfg
        self.limits = protocol.EngineLimits(self.cfg.vocab_size, max_seq_len)
        self.version = int(version)
        self.rows_n = max_batch
        self.buckets = length_buckets(max_seq_len)
        self._graphdef, self._params, self._rest = nnx.split(model, nnx.Param, ...)
        self._base_params = self._params
        self._retired: list[Any] = []  # replaced weights, freed by _release_retired
        self._retire_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retire-weights")
        self._adapters_like = None
        if lora is not None:
            rank, alpha, targets = lora
            self._adapters_like = jax.eval_shape(
                lambda p: lora_lib.init(p, rank, alpha, tuple(targets)), self._params
            )
        self._cache = auto.init_cache(self.cfg, max_batch, max_seq_len, cache_dtype or model.dtype)
        self._rows: list[_Row | None] = [None] * max_batch
        self._queue: collections.deque[GenerateRequest] = collections.deque()
        probe = sampling.sequence_key(0, 0, 0, 0)
        typed_keys = bool(jnp.issubdtype(probe.dtype, jax.dtypes.prng_key))
        self._key_data = np.zeros((max_batch, *self._key_data_of(probe).shape), np.uint32)
        self._temperature = np.ones(max_batch, np.float32)
        self._top_p = np.ones(max_batch, np.float32)
        self._last = np.zeros(max_batch, np.int32)
        self._shapes_seen: set[tuple] = set()
        self._steps = 0
        self._tokens_out = 0
        static = (self._graphdef, typed_keys)
        self._prefill_fn = jax.jit(functools.partial(programs.prefill, *static), donate_argnums=2)
        self._decode_fn = jax.jit(functools.partial(programs.decode, *static), donate_argnums=2)
        self._score_fn = jax.jit(functools.partial(programs.score, self._graphdef))

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_args(cls, args: Any) -> EmbeddedEngine:
        """Builds the engine from the server's command line (see server.build_arg_parser)."""
        dtype, param_dtype = jnp.dtype(args.dtype), jnp.dtype(args.param_dtype)
        if args.checkpoint:
            model = auto.from_pretrained(args.checkpoint, dtype=dtype)
        elif args.model_config:
            cfg = auto.config_from_hf(json.loads(args.model_config))
            model = auto.build(
                cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(args.init_seed)
            )
        else:
            raise ValueError("the embedded engine needs --checkpoint or --model-config")
        lora = None
        if args.lora_rank:
            lora = (args.lora_rank, args.lora_alpha, tuple(args.lora_targets.split(",")))
        return cls(model, max_batch=args.max_batch, max_seq_len=args.max_seq_len, lora=lora)

    @staticmethod
    def _key_data_of(key: jax.Array) -> np.ndarray:
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            return np.asarray(jax.random.key_data(key))
        return np.asarray(key)

    def request_key(self, request: GenerateRequest) -> np.ndarray:
        """Raw key data of a request: sequence_key(seed, step, prompt, member), then the turn."""
        key = sampling.sequence_key(*request.key_ids)
        if request.turn is not None:
            key = jax.random.fold_in(key, request.turn)
        return self._key_data_of(key)

    # ------------------------------------------------------------------ Backend API

    def submit(self, request: GenerateRequest) -> None:
        protocol.validate_request(request, self.limits)
        self._queue.append(request)

    def cancel(self, request_id: str) -> bool:
        for req in self._queue:
            if req.request_id == request_id:
                self._queue.remove(req)
                return True
        for r, row in enumerate(self._rows):
            if row is not None and row.request.request_id == request_id:
                self._rows[r] = None
                return True
        return False

    def has_work(self) -> bool:
        return bool(self._queue) or any(row is not None for row in self._rows)

    def step(self) -> list[GenerateResult]:
        """Admits and prefills queued requests, decodes one token for every active row."""
        finished: list[GenerateResult] = []
        self._steps += 1
        admitted = self._admit()
        by_bucket: dict[int, list[int]] = collections.defaultdict(list)
        for r in admitted:
            by_bucket[bucket_for(self._rows[r].prompt_len, self.buckets)].append(r)
        for bucket, rows in sorted(by_bucket.items()):
            tokens, logprobs, routes = self._prefill(bucket, rows)
            for j, r in enumerate(rows):
                self._rows[r].routes.append(routes[j, : self._rows[r].prompt_len])
                self._advance(r, int(tokens[j]), float(logprobs[j]), finished)
        active = np.array([row is not None for row in self._rows])
        if active.any():
            self._note_shape(("decode",))
            tokens, logprobs, routes, self._cache = self._decode_fn(
                self._params, self._rest, self._cache, self._last, active, *self._sampling_arrays()
            )
            tokens, logprobs, routes = np.asarray(tokens), np.asarray(logprobs), np.asarray(routes)
            for r in np.flatnonzero(active):
                self._rows[r].routes.append(routes[r][None])  # the fed token's routes
                self._advance(int(r), int(tokens[r]), float(logprobs[r]), finished)
        return finished

    def fail_all(self, reason: str) -> list[GenerateResult]:
        ids = [req.request_id for req in self._queue]
        ids += [row.request.request_id for row in self._rows if row is not None]
        self._queue.clear()
        self._rows = [None] * self.rows_n
        self._cache = auto.init_cache(
            self.cfg, self.rows_n, self.limits.max_seq_len, self._cache.k.dtype
        )
        return [protocol.error_result(rid, reason, self.version) for rid in ids]

    @property
    def params(self) -> Any:
        """The parameters being served (nnx.State)."""
        return self._params

    def load_weights(self, path: str, version: int) -> None:
        """Loads a published snapshot; structure, shapes and dtypes must match the model's."""
        manifest = snapshots.read_manifest(path)
        if manifest["kind"] == "lora_adapters":
            if self._adapters_like is None:
                raise snapshots.SnapshotError(
                    f"{path} holds LoRA adapters but this engine was started without LoRA "
                    "(--lora-rank); start it with the learner's rank/alpha/targets, or publish "
                    "merged weights (lora.publish='merged')"
                )
            adapters = snapshots.load(path, expected_version=version, like=self._adapters_like)
            new = programs.merge_lora(self._base_params, jax.device_put(adapters))
        else:
            # On CPU the arrays alias the snapshot's read-only mapping (no copy).
            new = jax.device_put(snapshots.load(path, expected_version=version, like=self._params))
        self._retired.append(self._params)  # no local name: the worker drops the last reference
        self._params = new
        self._retire_pool.submit(self._release_retired)
        self.version = int(version)

    def _release_retired(self) -> None:
        """Frees replaced weights on a worker thread, off the load's acknowledgement path.

        Freeing weights that alias a snapshot's mapping unmaps it (and frees a pruned file's
        pages): ~0.5x a memory copy of the weights. jaxlib defers releasing Python-owned host
        buffers to the next call into it, so make one here rather than in the next load.
        """
        while self._retired:
            self._retired.pop()
        jax.device_put(np.zeros((), np.float32)).block_until_ready()

    def model(self) -> qwen3.Qwen3:
        """The loaded weights as a model (incremental scoring builds its programs from it)."""
        return nnx.merge(self._graphdef, self._params, self._rest)

    def score(self, token_lists: Sequence[np.ndarray]) -> list[np.ndarray]:
        """log p(tokens[t] | tokens[:t]) for t >= 1 of each sequence, under the loaded weights."""
        seqs = [np.asarray(t, dtype=np.int32).reshape(-1) for t in token_lists]
        for i, s in enumerate(seqs):
            if len(s) < 2 or len(s) > self.limits.max_seq_len:
                raise protocol.RequestError(
                    f"score: sequence {i} has {len(s)} tokens; need 2..{self.limits.max_seq_len}"
                )
            if s.min() < 0 or s.max() >= self.cfg.vocab_size:
                raise protocol.RequestError(
                    f"score: sequence {i} has token ids outside [0, {self.cfg.vocab_size})"
                )
        out: list[np.ndarray | None] = [None] * len(seqs)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        while order:
            bucket = bucket_for(len(seqs[order[0]]), self.buckets)
            rows = max(1, min(self.rows_n, _SCORE_LOGIT_BUDGET // (bucket * self.cfg.vocab_size)))
            rows = 1 << (rows.bit_length() - 1)  # powers of two keep the compile count bounded
            take = [i for i in order if len(seqs[i]) <= bucket][:rows]
            order = [i for i in order if i not in take]
            tokens = np.zeros((rows, bucket), np.int32)
            mask = np.zeros((rows, bucket), bool)
            for j, i in enumerate(take):
                tokens[j, : len(seqs[i])] = seqs[i]
                mask[j, : len(seqs[i])] = True
            self._note_shape(("score", rows, bucket))
            lp = np.asarray(self._score_fn(self._params, self._rest, tokens, mask))
            for j, i in enumerate(take):
                out[i] = lp[j, : len(seqs[i]) - 1].copy()
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "active": sum(row is not None for row in self._rows),
            "queued": len(self._queue),
            "rows": self.rows_n,
            "max_seq_len": self.limits.max_seq_len,
            "steps": self._steps,
            "tokens": self._tokens_out,
            "compiles": len(self._shapes_seen),
        }

    # ------------------------------------------------------------------ internals

    def _sampling_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._key_data, self._temperature, self._top_p

    def _note_shape(self, shape: tuple) -> None:
        self._shapes_seen.add(shape)

    def _admit(self) -> list[int]:
        admitted = []
        for r in range(self.rows_n):
            if not self._queue:
                break
            if self._rows[r] is None:
                req = self._queue.popleft()
                self._rows[r] = _Row(req, len(req.prompt_tokens))
                self._key_data[r] = self.request_key(req)
                self._temperature[r] = req.sampling.temperature
                self._top_p[r] = req.sampling.top_p
                admitted.append(r)
        return admitted

    def _prefill(self, bucket: int, rows: list[int]) -> tuple[np.ndarray, ...]:
        """Prefills the prompts of `rows` (all in `bucket`); first tokens, log-probs and the
        prompts' routes [n, bucket, M, K], in order.

        The arguments are padded to R prompt slots so there is one program per bucket; the
        program loops over the `len(rows)` real ones only, so padding costs no model compute.
        """
        n = len(rows)
        tokens = np.zeros((self.rows_n, bucket), np.int32)
        lengths = np.ones(self.rows_n, np.int32)
        dest = np.zeros(self.rows_n, np.int32)
        dest[:n] = rows
        for j, r in enumerate(rows):
            prompt = self._rows[r].request.prompt_tokens
            tokens[j, : len(prompt)] = prompt
            lengths[j] = len(prompt)
        key_data, temperature, top_p = (a[dest] for a in self._sampling_arrays())
        self._note_shape(("prefill", bucket))
        out_tokens, out_logprobs, out_routes, self._cache = self._prefill_fn(
            self._params,
            self._rest,
            self._cache,
            tokens,
            lengths,
            dest,
            np.int32(n),
            key_data,
            temperature,
            top_p,
        )
        return (
            np.asarray(out_tokens)[:n],
            np.asarray(out_logprobs)[:n],
            np.asarray(out_routes)[:n],
        )

    def _advance(self, r: int, token: int, logprob: float, finished: list) -> None:
        """Appends row r's new token; frees the row when its request is done."""
        row = self._rows[r]
        row.tokens.append(token)
        row.logprobs.append(logprob)
        self._tokens_out += 1
        sp = row.request.sampling
        reason = None
        if token in sp.stop_token_ids:
            reason = protocol.FINISH_STOP
        elif len(row.tokens) >= sp.max_new_tokens:
            reason = protocol.FINISH_LENGTH
        elif row.prompt_len + len(row.tokens) >= self.limits.max_seq_len:
            reason = protocol.FINISH_LENGTH  # the row is full: the token cannot be fed back
        if reason is None:
            self._last[r] = token
            return
        routes = None
        if row.routes and row.routes[0].shape[1]:  # a MoE policy
            routes = np.concatenate(row.routes).astype(np.int32)
        finished.append(
            GenerateResult(
                row.request.request_id,
                row.tokens,
                row.logprobs,
                reason,
                self.version,
                None,
                routes,
            )
        )
        self._rows[r] = None
