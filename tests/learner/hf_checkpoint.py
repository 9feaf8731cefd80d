"""A user's own tiny Qwen3 checkpoint, made by transformers/tokenizers only (not this project).

`make_user_checkpoint(dir)` writes what a user would point `--config.model.checkpoint` at: a
random `Qwen3ForCausalLM` saved by transformers, and a byte-level BPE tokenizer trained by
`tokenizers` with its own ChatML chat template (tool calls as <tool_call> JSON blocks).
"""

import json

# ChatML with tools, written for this test (Hermes / Qwen style), independent of envs/chat.py.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "Tools you can call:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\n'
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls | default([]) %}"
    '<tool_call>{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>tool\n"
    "{% endif %}<result>{{ m.content }}</result>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
CORPUS = [
    "def test_add():\n    assert add(1, 2) == 3\n",
    "The function returns the sum of two numbers. Fix the bug in the file.",
    '{"name": "edit", "arguments": {"path": "calc.py", "old": "a - b", "new": "a + b"}}',
    "import os\nprint(open('README.md').read())\n",
] * 20


# Tiny mixture-of-experts variants (`arch`): transformers' own classes and sizes.
MOE_ARCHS = {
    "qwen3_moe": dict(
        cls="Qwen3MoeConfig",
        num_experts=5,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        norm_topk_prob=True,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    "glm4_moe_lite": dict(
        cls="Glm4MoeLiteConfig",
        n_routed_experts=6,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        moe_intermediate_size=24,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        routed_scaling_factor=1.8,
    ),
}


def make_user_checkpoint(path: str, vocab_size: int = 512, arch: str = "qwen3") -> None:
    """Writes a tiny random Qwen3 (or `arch` in MOE_ARCHS) + BPE tokenizer with a chat template
    to `path`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 16,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    common = dict(
        vocab_size=vocab_size,  # a few unused rows past the tokenizer, as real checkpoints have
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    if arch == "qwen3":
        config = Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **common)
        Qwen3ForCausalLM(config).save_pretrained(path)
    else:
        extra = dict(MOE_ARCHS[arch])
        config = getattr(transformers, extra.pop("cls"))(**common, **extra)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    with open(f"{path}/config.json") as f:
        assert json.load(f)["model_type"] == arch
