"""Rendered demonstrations kept by input (schedule/demo_cache.py): a second run with the same
inputs in another workdir reads back exactly what the first rendered; other inputs, a
tokenizer from a directory, or no cache directory render."""

import dataclasses
import os

import numpy as np
import pytest

from configs import cpu
from thundersync_jax.learner.sft import SFTExample
from thundersync_jax.models import tokenizer
from thundersync_jax.schedule import demo_cache


@dataclasses.dataclass(frozen=True)
class _Task:
    task_id: str
    repo: str  # a path under the run's workdir, as mini-SWE instances hold


def _examples(seed):
    rng = np.random.default_rng(seed)
    return [
        SFTExample(
            task_id=f"t{i}",
            tokens=rng.integers(0, 384, size=17 + i).astype(np.int32),
            loss_mask=rng.random(17 + i) < 0.5,
            reward=float(i % 2),
            complete=bool(i),
        )
        for i in range(3)
    ]


class _Renderer:
    """A task family whose demonstrations count their renderings."""

    name = "mini_swe"

    def __init__(self):
        self.calls = 0

    def demonstrations(self, config, tasks, tok, workdir):
        self.calls += 1
        return _examples(self.calls)


def _get(config, workdir, tok, render):
    tasks = [_Task("a", os.path.join(workdir, "repo-a")), _Task("b", os.path.join(workdir, "b"))]
    return demo_cache.cached_demonstrations(config, render, tasks, tok, str(workdir))


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.task_id, x.reward, x.complete) == (y.task_id, y.reward, y.complete)
        assert x.tokens.dtype == y.tokens.dtype and np.array_equal(x.tokens, y.tokens)
        assert x.loss_mask.dtype == y.loss_mask.dtype and np.array_equal(x.loss_mask, y.loss_mask)


def test_same_inputs_in_another_workdir_read_back_the_first_rendering(tmp_path, monkeypatch):
    monkeypatch.setenv(demo_cache.DEMO_CACHE_ENV, str(tmp_path / "demos"))
    config, tok, render = cpu.get_config("smoke"), tokenizer.ByteTokenizer(), _Renderer()
    first = _get(config, tmp_path / "run1", tok, render)
    again = _get(config, tmp_path / "run2", tok, render)
    assert render.calls == 1
    _same(first, again)
    _same(first, _examples(1))


@pytest.mark.parametrize("change", ["limits", "decoys", "env", "tokenizer"])
def test_other_inputs_render_again(tmp_path, monkeypatch, change):
    monkeypatch.setenv(demo_cache.DEMO_CACHE_ENV, str(tmp_path / "demos"))
    config, tok, render = cpu.get_config("smoke"), tokenizer.ByteTokenizer(), _Renderer()
    _get(config, tmp_path / "run1", tok, render)
    if change == "limits":
        config.rollout.max_turns += 1
    elif change == "decoys":
        config.sft.decoys = not config.sft.decoys
    elif change == "env":
        config.env.difficulty = "hard"
    else:
        tok = tokenizer.ByteTokenizer(vocab_size=512)
    _same(_get(config, tmp_path / "run2", tok, render), _examples(2))
    assert render.calls == 2


def test_unset_directory_or_a_tokenizer_from_a_directory_always_renders(tmp_path, monkeypatch):
    config, render = cpu.get_config("smoke"), _Renderer()
    monkeypatch.delenv(demo_cache.DEMO_CACHE_ENV, raising=False)
    for _ in range(2):
        _get(config, tmp_path / "run", tokenizer.ByteTokenizer(), render)
    assert render.calls == 2 and not (tmp_path / "demos").exists()
    monkeypatch.setenv(demo_cache.DEMO_CACHE_ENV, str(tmp_path / "demos"))
    hf = object.__new__(tokenizer.HFTokenizer)  # any tokenizer that is not the byte one
    for _ in range(2):
        _get(config, tmp_path / "run", hf, render)
    assert render.calls == 4 and not (tmp_path / "demos").exists()
