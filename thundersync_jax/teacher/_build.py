"""Starts the run's teacher from the config's `teacher` section.

    teacher:
      checkpoint      a Qwen3 HF safetensors directory; empty = train an embedded teacher
      model           architecture of the embedded teacher (HF config.json fields)
      sft_steps       its supervised steps on the demonstrations (more than the student's)
      sft_learning_rate, max_batch, num_engines

The embedded teacher is trained by `learner.sft` on the same demonstrations as the student's
warm start, but larger and longer, so the student has something to learn from it; the result
is cached like the student's warm start (a second run with the same settings loads it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence

from thundersync_jax.learner import sft
from thundersync_jax.models import qwen3
from thundersync_jax.rollout import engine_cmd
from thundersync_jax.teacher._service import TeacherService

log = logging.getLogger(__name__)


def _checkpoint_config(path: str) -> qwen3.Qwen3Config:
    config_json = os.path.join(path, "config.json")
    if not os.path.exists(config_json):
        raise FileNotFoundError(
            f"teacher.checkpoint={path!r} has no config.json (need a Qwen3 HF directory)"
        )
    with open(config_json) as f:
        return qwen3.Qwen3Config.from_hf(json.load(f))


def train_embedded_teacher(
    config, examples: Sequence[sft.SFTExample], cache_dir: str
) -> sft.SFTResult:
    """The embedded teacher: `config.teacher.model` trained `teacher.sft_steps` steps."""
    t = config.teacher
    cfg = qwen3.Qwen3Config.from_config_dict(t.model)
    return sft.train_sft(
        cfg,
        examples,
        workdir=cache_dir,
        steps=int(t.sft_steps),
        learning_rate=float(t.sft_learning_rate),
        batch_size=int(config.sft.batch_size),
        seed=int(config.seed) + 1,  # not the student's init
        name="teacher",
        progress=False,
    )


def start_teacher(
    config,
    student_cfg: qwen3.Qwen3Config,
    examples: Callable[[], Sequence[sft.SFTExample]],
    cache_dir: str,
    snapshot_root: str,
) -> TeacherService:
    """Builds (or loads) the teacher and serves it in its own engine process(es).

    Args:
      config: the run config (sections `teacher`, `sft`, `rollout`, `seed`).
      student_cfg: the student's architecture; the teacher must share its vocabulary.
      examples: demonstrations for the embedded teacher (called only when it is trained).
      cache_dir: where the embedded teacher's SFT result is cached.
      snapshot_root: where the embedded teacher's weights are published for its process.
    """
    t = config.teacher
    serve = dict(
        max_seq_len=int(config.rollout.max_traj_tokens),
        max_batch=int(t.max_batch),
        num_engines=int(t.num_engines),
        dtype=str(t.model.dtype),
        request_timeout_s=float(config.rollout.request_timeout_s),
    )
    if t.checkpoint:
        teacher_cfg = _checkpoint_config(t.checkpoint)
        _check_vocab(teacher_cfg, student_cfg, f"teacher.checkpoint={t.checkpoint!r}")
        spec = engine_cmd.teacher_engines(config)  # the process loads the checkpoint
        return TeacherService.from_checkpoint(t.checkpoint, spec=spec, **serve)
    teacher_cfg = qwen3.Qwen3Config.from_config_dict(t.model)
    _check_vocab(teacher_cfg, student_cfg, "teacher.model")
    result = train_embedded_teacher(config, examples(), cache_dir)
    log.info(
        "teacher: %s (cache hit: %s, last sft loss %.4f)",
        result.path,
        result.cache_hit,
        result.losses[-1] if result.losses else float("nan"),
    )
    spec = engine_cmd.teacher_engines(config, teacher_cfg)
    return TeacherService.from_model(result.model, snapshot_root, spec=spec, **serve)


def _check_vocab(teacher_cfg, student_cfg, what: str) -> None:
    if teacher_cfg.vocab_size != student_cfg.vocab_size:
        raise ValueError(
            f"{what} has vocab_size={teacher_cfg.vocab_size} but the student has "
            f"{student_cfg.vocab_size}: on-policy distillation scores the student's tokens with "
            "the teacher, so both must share one tokenizer"
        )
