"""Supervised warm start: demonstrations render with real observations, the loss matches a
float64 reference and drops, and a second run loads the cache instead of training."""

import numpy as np
import pytest

from configs import common
from thundersync_jax.envs import agent_demos, chat
from thundersync_jax.envs.base import Environment, StepResult, ToolCall, ToolSpec, VerifierResult
from thundersync_jax.envs.trajectory import LoopLimits
from thundersync_jax.learner import sft
from thundersync_jax.models import qwen3, tokenizer

WORDS = ("apple", "river", "stone", "cloud", "ember")


class NotesEnv(Environment):
    """Write a word into a named file of an in-memory filesystem, then submit."""

    tools = (
        ToolSpec("write", "Write text to a file.", {"path": "file name", "text": "content"}),
        ToolSpec("read", "Show a file.", {"path": "file name"}),
        ToolSpec("submit", "Finish.", {}),
    )

    def __init__(self, index: int):
        self.task_id = f"notes-{index}"
        self.word = WORDS[index % len(WORDS)]
        self.path = f"n{index % 3}.txt"
        self.files: dict[str, str] = {}

    def reset(self) -> str:
        self.files = {"readme.txt": "hello"}
        return f"Write {self.word} to {self.path}."

    def step(self, call: ToolCall) -> StepResult:
        if call.name == "write":
            self.files[str(call.arguments["path"])] = str(call.arguments["text"])
            return StepResult("ok")
        if call.name == "read":
            return StepResult(self.files.get(str(call.arguments["path"]), "error: no such file"))
        return StepResult("submitted", done=True)

    def verify(self) -> VerifierResult:
        ok = self.files.get(self.path) == self.word
        return VerifierResult(float(ok), "file matches" if ok else "file differs")

    def demonstration(self) -> list[ToolCall]:
        return [
            ToolCall("write", {"path": self.path, "text": self.word}),
            ToolCall("read", {"path": self.path}),
            ToolCall("submit", {}),
        ]


TOK = tokenizer.ByteTokenizer()
LIMITS = LoopLimits(max_traj_tokens=256)


def _examples(n=6):
    return agent_demos.demonstration_examples(
        [lambda i=i: NotesEnv(i) for i in range(n)], TOK, LIMITS
    )


def test_demonstration_masks_exactly_the_assistant_turns():
    env = NotesEnv(1)
    ex = agent_demos.render_demonstration(env, TOK, LIMITS)
    fmt = chat.get_format(TOK)
    expected = "".join(fmt.assistant_text("", [c]) + fmt.end_of_turn for c in env.demonstration())
    assert TOK.decode(ex.tokens[ex.loss_mask]) == expected
    assert ex.reward == 1.0 and ex.complete
    # Observations come from running the calls: the read shows what the write stored.
    text = TOK.decode(ex.tokens)
    assert "<tool_response>river</tool_response>" in text
    assert text.startswith("<|system|>tools: write(path,text) read(path) submit()<|im_end|>")


def test_unsolved_demonstration_is_rejected():
    class Broken(NotesEnv):
        def demonstration(self):
            return [ToolCall("submit", {})]

    with pytest.raises(ValueError, match="not a solved episode"):
        agent_demos.demonstration_examples([lambda: Broken(0)], TOK, LIMITS)


def test_next_token_loss_matches_float64_reference():
    rng = np.random.default_rng(0)
    b, t, v = 3, 7, 11
    logits = rng.normal(size=(b, t - 1, v)).astype(np.float32)
    tokens = rng.integers(0, v, size=(b, t)).astype(np.int32)
    mask = rng.random((b, t)) < 0.5
    mask[0, 1] = True
    logits64 = logits.astype(np.float64)
    logp = logits64 - np.log(np.exp(logits64).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
    want = -(picked * mask[:, 1:]).sum() / mask[:, 1:].sum()
    got = float(sft.next_token_loss(logits, tokens, mask))
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow
def test_sft_loss_drops_and_second_run_hits_cache(tmp_path):
    cfg = qwen3.Qwen3Config.from_config_dict(common.tiny_qwen3_model())
    examples = _examples()
    kw = dict(workdir=str(tmp_path), steps=40, learning_rate=1e-2, batch_size=4, progress=False)
    first = sft.train_sft(cfg, examples, **kw)
    assert not first.cache_hit and len(first.losses) == 40
    assert np.mean(first.losses[-5:]) < 0.3 * first.losses[0], first.losses[::10]

    second = sft.train_sft(cfg, examples, **kw)
    assert second.cache_hit and second.path == first.path and second.losses == first.losses
    a = qwen3.to_hf_state_dict(first.model, cfg)
    b = qwen3.to_hf_state_dict(second.model, cfg)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])

    # Different data or hyperparameters are a different cache entry.
    other = sft.cache_key(cfg, examples[:-1], {"steps": 60})
    assert other != sft.cache_key(cfg, examples, {"steps": 60})
    assert other != sft.cache_key(cfg, examples[:-1], {"steps": 61})
