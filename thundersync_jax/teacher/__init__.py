"""Teacher scoring for on-policy distillation: a frozen teacher in its own engine process.

from thundersync_jax import teacher
service = teacher.start_teacher(config, student_cfg, examples, cache_dir, snapshot_root)
future = service.scorer.score_turn(prefix_tokens, turn_start, turn_end)  # async
teacher_logprobs = future.result()   # float32 [turn_end - turn_start]
service.close()
"""

from thundersync_jax.teacher._build import start_teacher, train_embedded_teacher
from thundersync_jax.teacher._scorer import ScoreBackend, TeacherScorer
from thundersync_jax.teacher._service import TEACHER_VERSION, TeacherService

__all__ = [
    "TEACHER_VERSION",
    "ScoreBackend",
    "TeacherScorer",
    "TeacherService",
    "start_teacher",
    "train_embedded_teacher",
]
