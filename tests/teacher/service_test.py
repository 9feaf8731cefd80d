"""The teacher's engine process started from the run's engine command line and placement.

A real embedded engine process (`rollout.engine_cmd.teacher_engines`), the teacher's weights
published to it, its scores against the same model's log-probs computed in this process.
"""

import numpy as np
import pytest
from flax import nnx

from configs import terminal_opd_cpu
from thundersync_jax import losses
from thundersync_jax.rollout import engine_cmd
from thundersync_jax.teacher import TeacherService


@pytest.mark.slow  # one engine process: ~30-70 s on a shared 2-core machine
def test_teacher_served_with_the_runs_engine_spec_scores_like_the_model(tmp_path, tiny_policy):
    config = terminal_opd_cpu.get_config("smoke")
    config.rollout.max_traj_tokens = 64
    cfg, graphdef, params = tiny_policy(3)
    spec = engine_cmd.teacher_engines(config, cfg)
    assert spec.envs == [{"JAX_PLATFORMS": "cpu"}]  # a CPU config: the teacher gets no GPU
    model = nnx.merge(graphdef, params)
    tokens = np.random.default_rng(0).integers(1, cfg.vocab_size, 20)
    want = np.asarray(losses.token_logprobs(model(tokens[None, :-1]), tokens[None, 1:]))[0]
    with TeacherService.from_model(
        model, str(tmp_path / "shm"), max_seq_len=64, spec=spec, request_timeout_s=300
    ) as service:
        assert len(service.manager.pids) == config.teacher.num_engines
        (got,) = service.score([tokens])
    np.testing.assert_allclose(got, want, atol=2e-5)
