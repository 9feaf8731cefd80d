"""Published terminal tasks (Terminal-Bench 2 and 1 layouts) inside an image the test builds:
the reference solution passes, an empty attempt and a wrong one fail, images are found by
name in a store, and the task family hands GRPO / OPD their demonstrations."""

import importlib.util
import pathlib
import shutil
import sys
import textwrap

import pytest

from configs import terminal_opd_cpu
from thundersync_jax.envs import task_families, terminal
from thundersync_jax.envs.base import ToolCall
from thundersync_jax.envs.images import build
from thundersync_jax.models import tokenizer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
WORDS = "the quick brown fox jumps over the lazy dog\n"  # 9 words


def _load(name, filename):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, pathlib.Path(__file__).with_name(filename)
        )
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


fixtures = _load("tsj_images_test_fixtures", "images_fixtures.py")


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def make_tasks(root):
    """(tasks dir, image store): one TB2 task (reward file, python tests) and one TB1 task
    (exit status), both in an image whose /app ships the input file."""
    tasks = root / "tasks"
    _write(tasks / "count-words", {
        "task.toml": """\
            version = "1.0"
            [metadata]
            difficulty = "easy"
            [verifier]
            timeout_sec = 60.0
            [agent]
            timeout_sec = 30.0
            [environment]
            docker_image = "tbench/count-words:2.0"
            """,
        "instruction.md": "Write the number of words in /app/words.txt to /app/count.txt.\n",
        "environment/Dockerfile": "FROM python:3.13-slim\nWORKDIR /app\nCOPY words.txt .\n",
        "tests/test.sh": """\
            #!/bin/bash
            if python /tests/test_outputs.py; then
              echo 1 > /logs/verifier/reward.txt
            else
              echo 0 > /logs/verifier/reward.txt
            fi
            exit 3  # the reward file decides, not the exit status
            """,
        "tests/test_outputs.py": """\
            import pathlib
            got = pathlib.Path("/app/count.txt").read_text().split()
            want = len(pathlib.Path("/app/words.txt").read_text().split())
            assert got == [str(want)], got
            """,
        "solution/solve.sh": "wc -w < /app/words.txt | tr -d ' ' > /app/count.txt\n",
    })  # fmt: skip
    _write(tasks / "first-word", {
        "task.yaml": "instruction: Write the first word of /app/words.txt to /app/first.txt.\n"
                     "max_test_timeout_sec: 60\n",
        "run-tests.sh": '#!/bin/bash\npython "$TEST_DIR/check.py"\n',
        "tests/check.py": "import sys\n"
                          "sys.exit(open('/app/first.txt').read().strip() != 'the')\n",
        "solution.sh": "head -n1 /app/words.txt | cut -d' ' -f1 > /app/first.txt\n",
    })  # fmt: skip
    base, env = fixtures.base_layers()
    app = build.write_layer(
        [build.directory("app"), build.file_bytes("app/words.txt", WORDS.encode())], str(root)
    )
    config = build.image_config([*base, app], env, "/app")
    store = root / "images"
    store.mkdir()
    build.write_docker_archive(
        str(store / "cw.tar"), [*base, app], config, "tbench/count-words:2.0"
    )
    build.write_oci_layout(str(store / "fw"), [*base, app], config, "first-word:latest")
    return str(tasks), str(store)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return make_tasks(tmp_path_factory.mktemp("tbench"))


def _play(task, calls, tmp_path):
    with terminal.BenchTaskEnv(
        task, workspace_parent=str(tmp_path), image_cache=fixtures.cache()
    ) as env:
        env.reset()
        for call in calls:
            env.step(call)
        return env.verify()


@pytest.mark.slow
def test_reference_passes_and_empty_or_wrong_attempts_fail(bench, tmp_path):
    tasks_dir, store = bench
    tasks = terminal.load_bench_tasks(tasks_dir, images=store)
    assert [t.task_id for t in tasks] == ["count-words", "first-word"]
    assert tasks[0].image.endswith("cw.tar:tbench/count-words:2.0")
    assert tasks[0].agent_timeout_s == 30.0 and tasks[1].verifier_timeout_s == 60.0
    for task in tasks:
        env = terminal.BenchTaskEnv(task)
        gold = _play(task, env.demonstration(), tmp_path)
        assert gold.reward == 1.0 and gold.error is None, gold
        empty = _play(task, [ToolCall("submit", {})], tmp_path)
        assert empty.reward == 0.0, empty
    wrong = ToolCall("bash", {"command": "echo 8 > /app/count.txt"})
    assert _play(tasks[0], [wrong], tmp_path).reward == 0.0
    assert "reward.txt" in _play(tasks[0], [wrong], tmp_path).reason  # not the exit status 3


def test_missing_images_and_malformed_tasks_are_one_error(bench, tmp_path):
    tasks_dir, _ = bench
    empty_store = tmp_path / "none"
    empty_store.mkdir()
    with pytest.raises(ValueError, match=r"2 image\(s\) not found") as e:
        terminal.load_bench_tasks(tasks_dir, images=str(empty_store))
    assert "tbench/count-words:2.0 (task count-words)" in str(e.value)
    broken = tmp_path / "broken"
    shutil.copytree(pathlib.Path(tasks_dir) / "count-words", broken / "no-tests")
    (broken / "no-tests" / "tests" / "test.sh").unlink()
    with pytest.raises(ValueError, match="no-tests: missing tests/test.sh"):
        terminal.load_bench_tasks(str(broken))


@pytest.mark.slow
def test_family_gives_demonstrations_for_grpo_and_opd(bench, tmp_path):
    tasks_dir, store = bench
    c = terminal_opd_cpu.get_config("smoke")
    c.env.family, c.env.dataset, c.env.images = "terminal_bench", tasks_dir, store
    family = task_families.get("terminal_bench")
    family.check(c)
    tasks = family.build_tasks(c, str(tmp_path))
    examples = family.demonstrations(c, tasks, tokenizer.for_run(c), str(tmp_path))
    assert len(examples) == 2 and all(ex.reward == 1.0 for ex in examples)
    c.env.dataset = ""
    with pytest.raises(ValueError, match="needs env.dataset"):
        family.check(c)
