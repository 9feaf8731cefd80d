"""Orbax snapshot -> vLLM weights: conversion (runs anywhere) and the worker-side loader.

`snapshot_to_hf_state_dict` reads a published snapshot and returns HF tensor names and layout
(`qwen3.to_hf_state_dict`); it needs JAX but not vLLM, so it is tested without vLLM.

`SnapshotWorkerExtension` is mixed into every vLLM worker (`LLM(worker_extension_cls=...)`).
It loads through vLLM's own in-place reload (`model_runner.reload_weights`), the path that
re-runs each layer's `process_weights_after_loading` (on CPU that repacks every linear layer's
weight into the oneDNN / packed-GEMM copy the kernels actually read).

Tied embeddings (`tie_word_embeddings=True`, Qwen3-0.6B/1.7B/4B). Measured with vLLM 0.32.0's
CPU backend on a tiny tied Qwen3: `collective_rpc("reload_weights", kwargs={"weights_path": DIR})`
serves different greedy tokens than our float32 JAX model on the same weights (the untied model
matches), while this path — `reload_weights` with an iterator of the snapshot's tensors —
matches the learner's log-probs to 4.8e-7 (float32) and 5.7e-3 (bfloat16, whose LM head runs on
a packed copy of the weight) even without `refresh_tied_head`. Why the path-based reload goes
wrong was not pinned down. `refresh_tied_head` re-runs the shared head's post-load processing
(repacking from the updated shared weight) after every load anyway, a cheap guard for kernels
that compute the head from a copy; the load probe (load_probe) is what proves each load.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from thundersync_jax.rollout import snapshots

EXTENSION_CLS = "thundersync_jax.rollout.vllm_weights.SnapshotWorkerExtension"


def abstract_params(cfg: Any, param_dtype: Any = None) -> Any:
    """Shapes and dtypes of a Qwen3's parameters (nnx.State of ShapeDtypeStruct), no memory."""
    import jax.numpy as jnp
    from flax import nnx

    from thundersync_jax.models import auto

    dtype = jnp.float32 if param_dtype is None else param_dtype
    abstract = nnx.eval_shape(lambda: auto.build(cfg, param_dtype=dtype))
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
    from thundersync_jax.models import auto

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
    return auto.to_hf_state_dict(params, cfg)


def to_torch(array: np.ndarray):
    """A torch tensor with `array`'s values (bfloat16 bit-exact)."""
    import torch

    if not array.flags.writeable:  # torch warns on read-only buffers (e.g. views of jax arrays)
        array = array.copy()
    if array.dtype.name == "bfloat16":  # torch cannot read ml_dtypes' bfloat16 directly
        return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def refresh_tied_head(model: Any) -> bool:
    """Re-derives a tied LM head's kernel form from the shared embedding; True if it did.

    See the module docstring: vLLM's reload leaves a tied head's processed weights stale.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head.weight is not embed.weight:
        return False
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True


def rebuild_cpu_moe_kernels(model: Any) -> int:
    """CPU backend: drops every fused-MoE layer's kernel so the next reload rebuilds it; the count.

    vLLM 0.32's unquantized MoE method treats a second `process_weights_after_loading` as a
    weight update (`moe_kernel` already set) and then skips the experts' own post-load step,
    which on CPU is the grouped-GEMM prepack: the reloaded weights land unpacked in the packed
    tensors (measured on a tiny Qwen3-MoE: the load probe off by 0.88 nats). With no kernel,
    the reload takes the first-load path (convert, pad, prepack, new kernel), whose result is
    copied into the tensors the engine reads. GPU backends are left alone (their update path
    keeps the captured CUDA-graph addresses).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if getattr(method, "moe_kernel", None) is not None and hasattr(method, "_init_moe_kernel"):
            method.moe_kernel = None
            count += 1
    return count


class SnapshotWorkerExtension:
    """Mixed into every vLLM worker (LLM(worker_extension_cls=EXTENSION_CLS)); runs there."""

    def load_thundersync_snapshot(self, path: str, version: int, hf_config_json: str) -> int:
        import torch

        from thundersync_jax.models import auto

        cfg = auto.config_from_hf(json.loads(hf_config_json))
        state = snapshot_to_hf_state_dict(path, version, cfg)
        weights = ((name, to_torch(array)) for name, array in state.items())
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        rebuild_cpu_moe_kernels(model)
        with torch.no_grad():
            # The in-place reload re-runs each layer's post-load processing (kernel layouts,
            # CPU weight packing) and copies the result into the tensors the engine uses.
            runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            if cfg.tie_word_embeddings:
                refresh_tied_head(model)
        return int(version)
