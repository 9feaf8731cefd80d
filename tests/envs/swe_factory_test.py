"""Task sets and environments from the config's env section."""

import pytest

from configs import common
from thundersync_jax.envs.swe import factory, instance


def test_mini_swe_from_config(tmp_path):
    cfg = common.get_base_config().env
    cfg.num_tasks, cfg.difficulty = 3, "mixed"
    tasks = factory.load_instances(cfg, str(tmp_path), seed=1)
    assert [t.extra["difficulty"] for t in tasks] == ["easy", "medium", "hard"]
    env = factory.make_environment(tasks[0], str(tmp_path), cfg)
    assert env.sandbox_config["timeout_s"] == cfg.sandbox_timeout_s
    assert env.task_id == tasks[0].instance_id
    cfg.family, cfg.instances, cfg.num_tasks = "swe_jsonl", str(tmp_path / "i.jsonl"), 2
    instance.dump_jsonl(tasks, cfg.instances)
    assert factory.load_instances(cfg, str(tmp_path), seed=0) == tasks[:2]


@pytest.mark.parametrize(
    "family, difficulty, message",
    [
        ("mini_swe", "easy,expert", "env.difficulty 'easy,expert'"),
        ("terminal", "easy", "not a SWE family"),
        ("swe_jsonl", "easy", "needs env.instances"),
    ],
)
def test_config_errors(tmp_path, family, difficulty, message):
    cfg = common.get_base_config().env
    cfg.family, cfg.difficulty = family, difficulty
    with pytest.raises(ValueError, match=message):
        factory.load_instances(cfg, str(tmp_path), seed=0)
