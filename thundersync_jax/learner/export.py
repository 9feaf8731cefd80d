"""The final policy as a self-contained HF directory: weights, configs and the tokenizer.

    export_policy(graphdef, params, "runs/x/final", tok)

writes model.safetensors (in the params' dtype), config.json (with the tokenizer's eos/pad
ids), generation_config.json and the tokenizer files (an HF tokenizer's own files, or a
note for the byte tokenizer, which transformers cannot load), so `AutoTokenizer` and
`AutoModelForCausalLM` load the directory with nothing else beside it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from flax import nnx

from thundersync_jax.models import auto, hf_table, tokenizer

GENERATION_CONFIG = "generation_config.json"
BYTE_TOKENIZER_NOTE = "byte_tokenizer.json"


def _token_ids(tok: Any, all_stops: bool) -> dict[str, Any]:
    """eos/pad/bos ids; generation_config lists every stop id (end of turn, end of text)."""
    stops = [int(i) for i in getattr(tok, "stop_ids", ())] or [int(tok.eos_id)]
    return {
        "eos_token_id": (stops if len(stops) > 1 else stops[0]) if all_stops else int(tok.eos_id),
        "pad_token_id": int(tok.pad_id),
        "bos_token_id": getattr(tok, "bos_id", None),
    }


def export_policy(graphdef: nnx.GraphDef, params: Any, path: str, tok: Any) -> str:
    """Writes the policy `nnx.merge(graphdef, params)` and `tok` to `path`; returns `path`.

    Sharded params are gathered to the host one tensor at a time.
    """
    model = nnx.merge(graphdef, params)
    auto.save_pretrained(model, path)
    config_path = os.path.join(path, hf_table.CONFIG_FILE)
    with open(config_path) as f:
        hf_config = json.load(f)
    hf_config.update(_token_ids(tok, all_stops=False))
    with open(config_path, "w") as f:
        json.dump(hf_config, f, indent=2)
    with open(os.path.join(path, GENERATION_CONFIG), "w") as f:
        json.dump({**_token_ids(tok, all_stops=True), "_from_model_config": False}, f, indent=2)
    if isinstance(tok, tokenizer.HFTokenizer):
        tok.hf.save_pretrained(path)
    else:
        with open(os.path.join(path, BYTE_TOKENIZER_NOTE), "w") as f:
            json.dump(
                {
                    "kind": "byte",
                    "vocab_size": int(tok.vocab_size),
                    "note": "ids 0-255 are UTF-8 bytes; load with "
                    "thundersync_jax.models.tokenizer.ByteTokenizer(vocab_size)",
                    "special_ids": dict(tok.special_ids),
                },
                f,
                indent=2,
            )
    return path
