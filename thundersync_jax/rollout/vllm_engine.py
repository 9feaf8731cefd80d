"""vLLM engine (extra `vllm`): generation through vLLM, weights from our Orbax snapshots.

    python -m thundersync_jax.rollout.server --engine vllm --checkpoint HF_DIR \\
        --address ipc:///tmp/v0.sock --max-batch 64 --max-seq-len 4096 --dtype bfloat16

vLLM is imported lazily (only `VLLMBackend` touches it), so this module imports, and its weight
conversion is tested, on machines without vLLM or a GPU.

Weight path: `load_weights(path, version)` asks every vLLM worker (`LLM.collective_rpc`) to run
`SnapshotWorkerExtension.load_thundersync_snapshot`, which reads the snapshot from shared
memory in the worker process, converts the Flax parameters to HF names and torch layout
(`qwen3.to_hf_state_dict`), and feeds the (name, tensor) pairs to the model's own
`load_weights` — the path vLLM uses for HF checkpoints, which also fuses q/k/v and gate/up.
The prefix cache is reset afterwards, because cached KV blocks belong to the old weights.

Sampling differs from the embedded engine: vLLM draws with its own per-request generator,
seeded from the request's key ids, so a request is reproducible on vLLM but not token-identical
to the embedded sampler. vLLM reports the model's raw log-probs by default; pass
`--vllm-kwargs '{"logprobs_mode": "processed_logprobs"}'` (recent vLLM) for the log-probs of the
tempered / top-p distribution, which is what the embedded engine returns.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from thundersync_jax.rollout import protocol, snapshots
from thundersync_jax.rollout.protocol import GenerateRequest, GenerateResult

EXTENSION_CLS = "thundersync_jax.rollout.vllm_engine.SnapshotWorkerExtension"


# ----------------------------------------------------------------------------- conversion (CPU)


def abstract_params(cfg: Any, param_dtype: Any = None) -> Any:
    """Shapes and dtypes of a Qwen3's parameters (nnx.State of ShapeDtypeStruct), no memory."""
    import jax.numpy as jnp
    from flax import nnx

    from thundersync_jax.models import qwen3

    dtype = jnp.float32 if param_dtype is None else param_dtype
    abstract = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, param_dtype=dtype, rngs=nnx.Rngs(0)))
    return nnx.split(abstract, nnx.Param)[1]


def snapshot_to_hf_state_dict(
    path: str, version: int | None, cfg: Any, param_dtype: Any = None
) -> dict[str, np.ndarray]:
    """Loads a published snapshot and returns it as HF tensor name -> numpy array.

    Args:
      path: snapshot directory (see snapshots.publish).
      version: the version the manifest must hold (None: any).
      cfg: the model's qwen3.Qwen3Config.
      param_dtype: dtype the parameters were published in (default: the manifest's).
    """
    from thundersync_jax.models import qwen3

    manifest = snapshots.read_manifest(path)
    if manifest["kind"] == "lora_adapters":
        raise snapshots.SnapshotError(
            f"{path} holds LoRA adapters; the vLLM engine loads full weights "
            "(publish merged weights with lora.publish='merged')"
        )
    if param_dtype is None:
        dtypes = {entry["dtype"] for entry in manifest["leaves"]}
        if len(dtypes) != 1:
            raise snapshots.SnapshotError(f"{path}: mixed parameter dtypes {sorted(dtypes)}")
        param_dtype = dtypes.pop()
    like = abstract_params(cfg, param_dtype)
    params = snapshots.load(path, expected_version=version, like=like)
    return qwen3.to_hf_state_dict(params, cfg)


def _to_torch(array: np.ndarray):
    import torch

    if not array.flags.writeable:  # torch warns on read-only buffers (e.g. views of jax arrays)
        array = array.copy()
    if array.dtype.name == "bfloat16":  # torch cannot read ml_dtypes' bfloat16 directly
        return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


class SnapshotWorkerExtension:
    """Mixed into every vLLM worker (LLM(worker_extension_cls=EXTENSION_CLS)); runs there."""

    def load_thundersync_snapshot(self, path: str, version: int, hf_config_json: str) -> int:
        from thundersync_jax.models import qwen3

        cfg = qwen3.Qwen3Config.from_hf(json.loads(hf_config_json))
        state = snapshot_to_hf_state_dict(path, version, cfg)
        device = self.device  # the worker's accelerator
        weights = ((name, _to_torch(array).to(device)) for name, array in state.items())
        runner = self.model_runner
        # get_model() unwraps a CUDA-graph wrapper where vLLM has one.
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=weights)
        return int(version)


# ----------------------------------------------------------------------------- backend (GPU)


def request_seed(request: GenerateRequest) -> int:
    """A 63-bit vLLM seed from (seed, step, prompt, member, turn): arrival order plays no part."""
    blob = json.dumps([list(request.key_ids), request.turn]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1


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
            enable_prefix_caching=True,
            worker_extension_cls=EXTENSION_CLS,
            seed=args.init_seed,
        )
        kwargs.update(json.loads(args.vllm_kwargs))
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
        finished.append(GenerateResult(out.request_id, tokens, logprobs, reason, self.version))

    def fail_all(self, reason: str) -> list[GenerateResult]:
        ids = sorted(self._active)
        if ids:
            self.engine.abort_request(ids)
        self._active.clear()
        done, self._buffered = self._buffered, []
        return done + [protocol.error_result(rid, reason, self.version) for rid in ids]

    def load_weights(self, path: str, version: int) -> None:
        acks = self.llm.collective_rpc(
            "load_thundersync_snapshot", args=(path, int(version), json.dumps(self.hf_config))
        )
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
