"""Byte tokenizer round trips and special ids; HF tokenizer directories load locally."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from configs import common
from thundersync_jax.models import tokenizer

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "bash ls -la && cat file.py | grep foo",
    "The counter is 7. Increase it by 3.",
] * 8


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bpe"))
    tokenizer.train_bpe(CORPUS, out, vocab_size=331)
    return out


def test_byte_vocab_fits_tiny_model_config():
    tok = tokenizer.ByteTokenizer()
    assert tok.vocab_size == common.tiny_qwen3_model().vocab_size == 384
    assert max(tok.special_ids.values()) < tok.vocab_size
    assert min(tok.special_ids.values()) == 256
    assert len(set(tok.special_ids.values())) == len(tok.special_ids)
    assert tok.pad_id not in tok.stop_ids
    assert tok.special_ids[tokenizer.IM_END] in tok.stop_ids and tok.eos_id in tok.stop_ids


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_roundtrip_any_text(text):
    tok = tokenizer.ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    if not any(s in text for s in tok.SPECIALS):
        assert ids == list(text.encode("utf-8"))


def test_byte_specials_are_single_ids():
    tok = tokenizer.ByteTokenizer()
    ids = tok.encode("a<|im_start|>user\n<tool_call>{}</tool_call><|im_end|>")
    sid = tok.special_ids
    assert ids == [
        97,
        sid["<|im_start|>"],
        *b"user\n",
        sid["<tool_call>"],
        *b"{}",
        sid["</tool_call>"],
        sid["<|im_end|>"],
    ]
    # Partial or mangled markers stay plain bytes.
    assert tok.encode("<|im_sta") == list(b"<|im_sta")
    assert tok.encode("<<tool_call>") == [60, sid["<tool_call>"]]


def test_byte_decode_never_raises_on_sampled_ids():
    tok = tokenizer.ByteTokenizer()
    unused = list(range(256 + len(tok.SPECIALS), tok.vocab_size))
    assert tok.decode(unused) == ""
    assert tok.decode([0xFF, 0xFE, 104, 105]) == "\ufffd\ufffdhi"
    assert tok.decode([tok.pad_id, 104]) == "h"
    assert tok.decode([tok.special_ids["<|im_end|>"], 104], skip_special=True) == "h"


def test_byte_rejects_too_small_vocab():
    with pytest.raises(ValueError, match="vocab_size >= 269"):
        tokenizer.ByteTokenizer(vocab_size=260)


def test_hf_directory_matches_raw_tokenizers(hf_dir):
    from tokenizers import Tokenizer as RawTokenizer

    raw = RawTokenizer.from_file(f"{hf_dir}/tokenizer.json")
    tok = tokenizer.load(hf_dir)
    assert isinstance(tok, tokenizer.HFTokenizer)
    text = "<|im_start|>user\nbash ls ünï<tool_call>{}</tool_call><|im_end|>"
    assert tok.encode(text) == raw.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text)) == text
    for marker in tokenizer.CHAT_MARKERS:
        assert tok.special_ids[marker] == raw.token_to_id(marker)
        assert tok.encode(marker) == [raw.token_to_id(marker)]
    assert tok.eos_id == raw.token_to_id("<|im_end|>")
    assert tok.pad_id == raw.token_to_id("<|endoftext|>")
    assert tok.stop_ids == (raw.token_to_id("<|im_end|>"), raw.token_to_id("<|endoftext|>"))
    assert tok.vocab_size == raw.get_vocab_size()
    # Out-of-range ids (a model with a padded vocabulary can sample them) are dropped.
    assert tok.decode([tok.vocab_size + 5, *tok.encode("ls")]) == "ls"
    assert tok.chat_format == "qwen3"


def test_load_errors_name_the_spec(tmp_path):
    with pytest.raises(ValueError, match="'byte' or an existing directory"):
        tokenizer.load(str(tmp_path / "missing"))
    assert isinstance(tokenizer.load("byte"), tokenizer.ByteTokenizer)


def test_from_config():
    cfg = common.get_base_config()
    tok = tokenizer.from_config(cfg)
    assert isinstance(tok, tokenizer.ByteTokenizer) and tok.vocab_size == cfg.model.vocab_size
    assert isinstance(tok, tokenizer.Tokenizer)


def _user_checkpoint(path, vocab_size):
    """A checkpoint directory: config.json with `vocab_size` + a tokenizer with a template."""
    import json

    from thundersync_jax.envs import chat

    texts = ["def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3"] * 10
    tok = tokenizer.train_bpe(
        texts, str(path), vocab_size=300, chat_template=chat.QWEN3_CHAT_TEMPLATE
    )
    config = dict(
        model_type="qwen3",
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    with open(path / "config.json", "w") as f:
        json.dump(config, f)
    return tok


def test_run_tokenizer_comes_from_the_checkpoint_unless_overridden(tmp_path):
    ckpt = tmp_path / "ckpt"
    made = _user_checkpoint(ckpt, vocab_size=320)
    cfg = common.get_base_config()
    cfg.model.checkpoint = str(ckpt)
    tok = tokenizer.for_run(cfg)
    assert isinstance(tok, tokenizer.HFTokenizer) and tok.chat_format == "template"
    assert tok.vocab_size == made.vocab_size and tok.eos_id == made.eos_id
    cfg.tokenizer.kind = "byte"  # override: the byte tokenizer, sized to the checkpoint's model
    byte = tokenizer.for_run(cfg)
    assert isinstance(byte, tokenizer.ByteTokenizer) and byte.vocab_size == 320
    cfg.tokenizer.kind, cfg.tokenizer.path = "auto", str(ckpt)  # an explicit directory
    assert isinstance(tokenizer.for_run(cfg), tokenizer.HFTokenizer)
    cfg.tokenizer.kind, cfg.tokenizer.path = "hf", ""
    with pytest.raises(ValueError, match="kind='hf' needs config.tokenizer.path"):
        tokenizer.for_run(cfg)
    cfg.tokenizer.kind = "words"
    with pytest.raises(ValueError, match="tokenizer.kind='words'"):
        tokenizer.for_run(cfg)


def test_a_vocabulary_the_model_cannot_embed_is_a_clear_error(tmp_path):
    ckpt = tmp_path / "small"
    made = _user_checkpoint(ckpt, vocab_size=200)  # the tokenizer has more ids
    cfg = common.get_base_config()
    cfg.model.checkpoint = str(ckpt)
    with pytest.raises(
        ValueError, match=rf"has {made.vocab_size} ids but the model.s vocab_size is 200"
    ):
        tokenizer.for_run(cfg)
    cfg.model.checkpoint, cfg.model.vocab_size = "", 100  # byte tokenizer needs >= 268 rows
    with pytest.raises(ValueError, match="ByteTokenizer needs vocab_size >="):
        tokenizer.for_run(cfg)
