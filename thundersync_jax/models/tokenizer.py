"""Tokenizers: a byte-level one for tiny models trained from scratch, and HF tokenizers on disk.

Both kinds expose the same small surface (`Tokenizer`): `encode`, `decode`, `pad_id`,
`eos_id`, `stop_ids`, `special_ids` (name -> id for the chat and tool-call markers),
`vocab_size` and `chat_format` (which template of `thundersync_jax.envs.chat` renders
conversations for it: "qwen3" or "compact"). Special-token strings that appear in text
passed to `encode` become their single special id, as in HF tokenizers, so a rendered
chat template encodes to the marker ids the model was trained on.

    tok = tokenizer.load("byte")            # ByteTokenizer, vocab 384
    tok = tokenizer.load("/path/to/hf_dir")  # AutoTokenizer, local files only
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

# Chat and tool-call markers, named the way Qwen3's tokenizer spells them.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
THINK = "<think>"
THINK_END = "</think>"
CHAT_MARKERS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    THINK,
    THINK_END,
)


@runtime_checkable
class Tokenizer(Protocol):
    """What the chat templates, the agent loop and SFT need from a tokenizer."""

    vocab_size: int
    pad_id: int
    eos_id: int
    chat_format: str
    special_ids: dict[str, int]

    def encode(self, text: str) -> list[int]:
        """Text -> ids; special-token strings in `text` become their single id."""
        ...

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Ids -> text; never raises on ids the model may sample (invalid bytes, unused ids)."""
        ...

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn when sampled (end-of-turn and end-of-text)."""
        ...


class ByteTokenizer:
    """256 byte tokens followed by chat/tool special tokens; ids past those are unused padding.

    Ids 0..255 are the UTF-8 bytes, so any text round-trips exactly. Specials start at 256:
    pad, the Qwen3 chat and tool-call markers, and short role markers (`<|system|>`,
    `<|user|>`, `<|assistant|>`) that the compact chat format uses so a turn header costs
    one token instead of a dozen bytes.
    """

    PAD = "<|pad|>"
    SYSTEM = "<|system|>"
    USER = "<|user|>"
    ASSISTANT = "<|assistant|>"
    SPECIALS = (PAD, *CHAT_MARKERS, SYSTEM, USER, ASSISTANT)

    def __init__(self, vocab_size: int = 384, chat_format: str = "compact"):
        """Args: vocab_size: the model's embedding rows (>= 256 + number of specials).

        chat_format: "compact" (short role markers, default) or "qwen3".
        """
        needed = 256 + len(self.SPECIALS)
        if vocab_size < needed:
            raise ValueError(f"ByteTokenizer needs vocab_size >= {needed}, got {vocab_size}")
        if chat_format not in ("compact", "qwen3"):
            raise ValueError(f"chat_format must be 'compact' or 'qwen3', got {chat_format!r}")
        self.vocab_size = vocab_size
        self.chat_format = chat_format
        self.special_ids = {s: 256 + i for i, s in enumerate(self.SPECIALS)}
        self._special_by_id = {i: s for s, i in self.special_ids.items()}
        self.pad_id = self.special_ids[self.PAD]
        self.eos_id = self.special_ids[ENDOFTEXT]
        self.bos_id = None  # Qwen3 uses no BOS; kept for callers that ask.
        # Longest first so e.g. "</tool_call>" never matches as a shorter prefix.
        self._specials_by_length = sorted(self.SPECIALS, key=len, reverse=True)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.special_ids[IM_END], self.eos_id)

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of `text`, with every special-token string replaced by its id."""
        ids: list[int] = []
        start = 0
        # Scan for '<' only: every special starts with it, so plain text is copied in bulk.
        pos = text.find("<")
        while pos != -1:
            for special in self._specials_by_length:
                if text.startswith(special, pos):
                    ids.extend(text[start:pos].encode("utf-8"))
                    ids.append(self.special_ids[special])
                    start = pos + len(special)
                    break
            pos = text.find("<", max(pos + 1, start))
        ids.extend(text[start:].encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Bytes decode with replacement for invalid UTF-8; unused ids decode to ''."""
        parts: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if buf:
                parts.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
            special = self._special_by_id.get(i)
            if special is not None and not skip_special and special != self.PAD:
                parts.append(special)
        if buf:
            parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, chat_format={self.chat_format!r})"


class HFTokenizer:
    """A transformers tokenizer loaded from a local directory (never the hub)."""

    def __init__(self, path: str, chat_format: str = "qwen3"):
        """Args: path: a directory holding tokenizer.json / tokenizer_config.json.

        chat_format: the template that renders conversations for this tokenizer.
        """
        from transformers import AutoTokenizer  # heavy import, only when an HF dir is used

        if not os.path.isdir(path):
            raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
        self.path = path
        self.chat_format = chat_format
        self.hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        vocab = self.hf.get_vocab()
        self.special_ids = {s: vocab[s] for s in CHAT_MARKERS if s in vocab}
        eos = self.hf.eos_token_id
        if eos is None:
            eos = self.special_ids.get(ENDOFTEXT, self.special_ids.get(IM_END))
        if eos is None:
            raise ValueError(f"tokenizer at {path!r} defines no eos token and no {ENDOFTEXT}")
        self.eos_id = int(eos)
        pad = self.hf.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id
        self.bos_id = self.hf.bos_token_id
        self.vocab_size = len(self.hf)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        # End of turn, the tokenizer's eos, and <|endoftext|> (a base model's document end).
        candidates = [self.special_ids.get(IM_END), self.eos_id, self.special_ids.get(ENDOFTEXT)]
        return tuple(dict.fromkeys(i for i in candidates if i is not None))

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without added BOS/EOS (the chat template places every marker)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Decoded text; ids outside the vocabulary are dropped rather than raising."""
        valid = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
        return self.hf.decode(valid, skip_special_tokens=skip_special)

    def __repr__(self) -> str:
        return f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size})"


def train_bpe(
    texts: Sequence[str], out_dir: str, vocab_size: int = 512, chat_template: str | None = None
) -> HFTokenizer:
    """Trains a byte-level BPE tokenizer with the chat markers and saves an HF directory.

    For tiny experiments that want a subword vocabulary without any download; the saved
    directory loads with `load(out_dir)` and with transformers' `AutoTokenizer`.

    Args:
      texts: training corpus.
      out_dir: directory to write (tokenizer.json, tokenizer_config.json, template).
      vocab_size: target vocabulary size including the 256 byte symbols and the markers.
      chat_template: jinja chat template stored with the tokenizer (e.g. chat.QWEN3_CHAT_TEMPLATE).
    """
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_MARKERS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(texts, trainer)
    # Qwen3 instruct convention: <|im_end|> ends a turn (eos), <|endoftext|> pads.
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[s for s in CHAT_MARKERS if s != ENDOFTEXT],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    return HFTokenizer(out_dir)


def load(spec: str, vocab_size: int = 384) -> ByteTokenizer | HFTokenizer:
    """Returns the tokenizer named by `spec`: "byte" or a local HF tokenizer directory.

    Args:
      spec: "byte" for `ByteTokenizer`, otherwise a directory path.
      vocab_size: embedding rows for the byte tokenizer (ignored for HF directories).
    """
    if spec == "byte":
        return ByteTokenizer(vocab_size=vocab_size)
    if not spec or not os.path.isdir(spec):
        raise ValueError(f"tokenizer spec must be 'byte' or an existing directory, got {spec!r}")
    return HFTokenizer(spec)


TOKENIZER_KINDS = ("auto", "byte", "hf")


def _has_tokenizer(path: str) -> bool:
    return any(
        os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")
    )


def for_run(config) -> ByteTokenizer | HFTokenizer:
    """The run's tokenizer, checked against the model's vocabulary.

    `tokenizer.path` (an HF directory) overrides everything; `tokenizer.kind="byte"` forces
    the byte tokenizer; "hf" needs `tokenizer.path`; "auto" (the default) takes the tokenizer
    of `model.checkpoint` when that directory has one, else the byte tokenizer. An HF
    tokenizer with a chat template renders conversations with that template.

    Args:
      config: the run config; `model.vocab_size` is the checkpoint's own when one is given.
    """
    kind, path = str(config.tokenizer.kind), str(config.tokenizer.path or "")
    checkpoint = str(config.model.get("checkpoint", "") or "")
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"config.tokenizer.kind={kind!r}; valid: {TOKENIZER_KINDS}")
    if kind == "hf" and not path:
        raise ValueError("config.tokenizer.kind='hf' needs config.tokenizer.path (a directory)")
    if not path and kind == "auto" and checkpoint and _has_tokenizer(checkpoint):
        path = checkpoint
    vocab = int(config.model.vocab_size)
    if checkpoint:  # the architecture (and so the vocabulary) is the checkpoint's
        from thundersync_jax.models import auto

        vocab = auto.read_config(checkpoint).vocab_size
    if path and kind != "byte":
        tok = HFTokenizer(path, chat_format="qwen3")
        if getattr(tok.hf, "chat_template", None):
            tok.chat_format = "template"
    else:
        tok = ByteTokenizer(vocab_size=vocab)
    check_vocab(tok, vocab, where=path or kind)
    return tok


def check_vocab(tok, model_vocab_size: int, where: str = "") -> None:
    """ValueError when the tokenizer can produce ids the model's embedding has no row for."""
    if tok.vocab_size > model_vocab_size:
        raise ValueError(
            f"tokenizer {where or tok!r} has {tok.vocab_size} ids but the model's vocab_size is "
            f"{model_vocab_size}: ids >= {model_vocab_size} have no embedding row; use the "
            "checkpoint's own tokenizer or a model with vocab_size >= the tokenizer's"
        )


def from_config(cfg) -> ByteTokenizer | HFTokenizer:
    """Tokenizer from a config's `tokenizer` section and model (same as `for_run`)."""
    return for_run(cfg)
