"""Terminal tasks in their published layouts: Terminal-Bench 2 (harbor) and Terminal-Bench 1.

    tasks = bench.load_tasks("/data/tb2/tasks", images="/data/images")

Terminal-Bench 2 / harbor task directory:
    instruction.md            what the agent is asked to do
    task.toml                 [environment] docker_image (the prebuilt image, by name),
                              [agent] timeout_sec, [verifier] timeout_sec, memory_mb
    environment/Dockerfile    how the image was built (not built here: no daemon)
    tests/test.sh             run as `bash /tests/test.sh`; it writes the reward to
                              /logs/verifier/reward.txt (or reward.json {"reward": x});
                              without one its exit status decides (0 = solved)
    solution/solve.sh         optional reference solution (the demonstration)
SETA-Env (the paper's OPD tasks) is published in harbor's registry (`seta-env@1.0`) in this
layout. Terminal-Bench 1 (and the task sets written in its layout): task.yaml (`instruction`,
`max_agent_timeout_sec`, `max_test_timeout_sec`), run-tests.sh (run with TEST_DIR=/tests,
its exit status decides), tests/, solution.sh.

A task without `docker_image` is looked up as `<task directory name>:latest` (build its
environment/Dockerfile with that tag, `docker save` it, import it into the store). Images come
from an image store (`envs.images.store`); every task's image is resolved, and every task
directory checked, before anything starts: problems come back together in one ValueError.
"""

from __future__ import annotations

import dataclasses
import os

import tomllib

from thundersync_jax.envs.images.store import ImageStore

_MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class BenchTask:
    """One published terminal task.

    Attributes:
      task_id: the task directory's name.
      path: the task directory.
      instruction: the text shown to the agent.
      image_name: the image the task runs in, by name.
      image: that image resolved (`PATH:TAG`, what `open_image` reads).
      tests_dir: host directory whose files are copied to /tests for verification ("" =
        none).
      test_script: host path of the script copied to /tests and run there (`tests/test.sh`,
        or TB1's `run-tests.sh`).
      solution: the reference solution's shell script ("" = none).
      agent_timeout_s: wall-clock limit of one agent command.
      verifier_timeout_s: wall-clock limit of the test script.
      memory_mb: the box's address-space limit (0 = the config's).
    """

    task_id: str
    path: str
    instruction: str
    image_name: str
    image: str
    tests_dir: str
    test_script: str
    solution: str = ""
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    memory_mb: int = 0


def is_task_dir(path: str) -> bool:
    """A directory in either layout (task.toml + instruction.md, or task.yaml)."""
    has = lambda name: os.path.isfile(os.path.join(path, name))  # noqa: E731
    return (has("task.toml") and has("instruction.md")) or has("task.yaml")


def load_tasks(root: str, *, images: str = "", limit: int = 0) -> list[BenchTask]:
    """The tasks under `root` (a task directory, or a directory of them, sorted by name).

    Args:
      root: where the tasks are.
      images: the image store their images are found in ("" = none: every task fails).
      limit: keep the first `limit` tasks (0 = all).
    """
    if not os.path.isdir(root):
        raise ValueError(f"terminal tasks {root!r}: not a directory")
    dirs = [root] if is_task_dir(root) else [
        os.path.join(root, d) for d in sorted(os.listdir(root))
        if is_task_dir(os.path.join(root, d))
    ]  # fmt: skip
    if not dirs:
        raise ValueError(f"terminal tasks {root!r}: no task directory (task.toml or task.yaml)")
    dirs = dirs[:limit] if limit > 0 else dirs
    store = ImageStore(images) if images else None
    tasks, errors, missing = [], [], []
    for d in dirs:
        try:
            task = _read_task(d)
        except (ValueError, OSError, tomllib.TOMLDecodeError) as e:
            errors.append(f"{os.path.basename(d)}: {e}")
            continue
        found = store.resolve(task.image_name) if store else None
        if found is None:
            missing.append(f"{task.image_name} (task {task.task_id})")
        tasks.append(dataclasses.replace(task, image=found or ""))
    if errors:
        raise ValueError(f"terminal tasks {root}: {len(errors)} malformed task(s):\n  "
                         + "\n  ".join(errors[:_MAX_LISTED]))  # fmt: skip
    if missing:
        where = f"the image store {images}" if images else "no image store (env.images)"
        raise ValueError(
            f"terminal tasks {root}: {len(missing)} image(s) not found in {where}:\n  "
            + "\n  ".join(missing[:_MAX_LISTED])
            + "\nadd them with `python -m thundersync_jax.envs.images import FILE --store DIR`"
        )
    return tasks


def _read_task(path: str) -> BenchTask:
    name = os.path.basename(os.path.normpath(path))
    if os.path.isfile(os.path.join(path, "task.toml")):
        return _read_tb2(path, name)
    return _read_tb1(path, name)


def _read_tb2(path: str, name: str) -> BenchTask:
    with open(os.path.join(path, "task.toml"), "rb") as f:
        meta = tomllib.load(f)
    with open(os.path.join(path, "instruction.md"), encoding="utf-8") as f:
        instruction = f.read().strip()
    tests = os.path.join(path, "tests")
    if not os.path.isfile(os.path.join(tests, "test.sh")):
        raise ValueError("missing tests/test.sh")
    env = meta.get("environment") or {}
    return BenchTask(
        task_id=name,
        path=os.path.abspath(path),
        instruction=_nonempty(instruction, "instruction.md"),
        image_name=str(env.get("docker_image") or f"{name}:latest"),
        image="",
        tests_dir=os.path.abspath(tests),
        test_script=os.path.join(os.path.abspath(tests), "test.sh"),
        solution=_read_optional(os.path.join(path, "solution", "solve.sh")),
        agent_timeout_s=float((meta.get("agent") or {}).get("timeout_sec", 600.0)),
        verifier_timeout_s=float((meta.get("verifier") or {}).get("timeout_sec", 600.0)),
        memory_mb=int(env.get("memory_mb") or 0),
    )


def _read_tb1(path: str, name: str) -> BenchTask:
    import yaml

    with open(os.path.join(path, "task.yaml"), encoding="utf-8") as f:
        meta = yaml.safe_load(f) or {}
    instruction = meta.get("instruction")
    if not instruction and meta.get("descriptions"):
        instruction = meta["descriptions"][0].get("description")
    if not os.path.isfile(os.path.join(path, "run-tests.sh")):
        raise ValueError("missing run-tests.sh")
    return BenchTask(
        task_id=name,
        path=os.path.abspath(path),
        instruction=_nonempty(str(instruction or "").strip(), "task.yaml instruction"),
        image_name=str(meta.get("docker_image") or f"{name}:latest"),
        image="",
        tests_dir=os.path.abspath(os.path.join(path, "tests"))
        if os.path.isdir(os.path.join(path, "tests"))
        else "",
        test_script=os.path.join(os.path.abspath(path), "run-tests.sh"),
        solution=_read_optional(os.path.join(path, "solution.sh")),
        agent_timeout_s=float(meta.get("max_agent_timeout_sec", 600.0)),
        verifier_timeout_s=float(meta.get("max_test_timeout_sec", 600.0)),
    )


def _nonempty(text: str, field: str) -> str:
    if not text:
        raise ValueError(f"{field} is empty")
    return text


def _read_optional(path: str) -> str:
    if not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read()
