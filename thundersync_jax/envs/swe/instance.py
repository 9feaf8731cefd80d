"""SWE-bench task instances: the record, and reading/writing them as JSONL.

The fields follow the SWE-bench dataset (FAIL_TO_PASS / PASS_TO_PASS may be
JSON-encoded strings there, or plain lists), plus optional fields for
offline use: `repo_path` (a local git repository used instead of cloning
`repo`), `env` (environment variables for the test run), `test_cmd` (the
command test ids are appended to), `image` (a container image the tools and
tests run in: an OCI layout directory or a `docker save` tarball, optionally
`:TAG` or `@sha256:DIGEST`; see thundersync_jax.envs.images) and `repo_dir`
(where the repository appears in that image, default /testbed) and `setup_patch`
(a diff applied and committed on top of base_commit before the episode starts: the
task's real starting point; SWE-smith rows introduce their bug with it). One more
optional field is read from `extra`: `editable_paths`, path prefixes a model
patch may change (the verifier ignores changes elsewhere; mini-SWE sets it to
the package so tests and pytest config cannot be edited into a pass).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

DEFAULT_TEST_CMD = "python -m pytest -q -p no:cacheprovider"
DEFAULT_REPO_DIR = "/testbed"  # where SWE-bench images keep the repository

_REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)

_OPTIONAL = ("repo_path", "env", "test_cmd", "image", "repo_dir", "setup_patch")


@dataclasses.dataclass(frozen=True)
class SweInstance:
    """One SWE-bench-format task.

    Attributes:
      instance_id: unique name, e.g. "owner__repo-1234".
      repo: "owner/name" on GitHub; cloned only when `repo_path` is empty.
      base_commit: the commit the agent starts from (the buggy state).
      problem_statement: the issue text shown to the agent.
      patch: the gold fix (a unified diff against base_commit).
      test_patch: the tests that check the fix (a unified diff against base_commit).
      fail_to_pass: test ids that must go from failing to passing.
      pass_to_pass: test ids that must keep passing.
      repo_path: a local git repository holding base_commit ("" = clone `repo`).
      env: environment variables for test runs and agent commands.
      test_cmd: the test command; test ids are appended to it.
      image: container image to run in ("" = the host's toolchain); a relative path is
        resolved against the JSONL file's directory.
      repo_dir: where the repository is mounted in the image (absolute box path).
      setup_patch: a diff committed on top of base_commit at reset and before scoring
        ("" = none); the agent's patch and the tests are taken against the result.
      extra: any other fields of the JSONL record, kept for round trips.
    """

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    repo_path: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    test_cmd: str = DEFAULT_TEST_CMD
    image: str = ""
    repo_dir: str = DEFAULT_REPO_DIR
    setup_patch: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def test_ids(self) -> tuple[str, ...]:
        """FAIL_TO_PASS then PASS_TO_PASS, without duplicates."""
        return tuple(dict.fromkeys(self.fail_to_pass + self.pass_to_pass))

    @classmethod
    def from_dict(cls, record: dict[str, Any], base_dir: str = "") -> SweInstance:
        """Builds an instance from one SWE-bench record.

        Args:
          record: the JSON object; must hold every SWE-bench field named above.
          base_dir: a relative `repo_path` is resolved against this directory
            (the JSONL file's directory when loading a file).
        """
        missing = [k for k in _REQUIRED if k not in record]
        if missing:
            name = record.get("instance_id", "<no instance_id>")
            raise ValueError(f"instance {name}: missing field(s) {missing}; required: {_REQUIRED}")
        repo_path = record.get("repo_path") or ""
        if repo_path and base_dir and not os.path.isabs(repo_path):
            repo_path = os.path.normpath(os.path.join(base_dir, repo_path))
        env = record.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError(
                f"instance {record['instance_id']}: env must be an object, got {env!r}"
            )
        known = set(_REQUIRED) | set(_OPTIONAL)
        image = str(record.get("image") or "")
        if image and base_dir and not os.path.isabs(image):
            image = os.path.normpath(os.path.join(base_dir, image))
        repo_dir = str(record.get("repo_dir") or DEFAULT_REPO_DIR)
        if not os.path.isabs(repo_dir) or os.path.normpath(repo_dir) == "/":
            raise ValueError(
                f"instance {record['instance_id']}: repo_dir must be an absolute path other "
                f"than '/', got {repo_dir!r}"
            )
        fail_to_pass = _test_list(record, "FAIL_TO_PASS")
        pass_to_pass = _test_list(record, "PASS_TO_PASS")
        if not fail_to_pass and not pass_to_pass:
            # With no ids the test command would run everything and "resolve" vacuously.
            raise ValueError(
                f"instance {record['instance_id']}: FAIL_TO_PASS and PASS_TO_PASS are both empty"
            )
        return cls(
            instance_id=str(record["instance_id"]),
            repo=str(record["repo"]),
            base_commit=str(record["base_commit"]),
            problem_statement=str(record["problem_statement"]),
            patch=str(record["patch"] or ""),
            test_patch=str(record["test_patch"] or ""),
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
            repo_path=str(repo_path),
            env={str(k): str(v) for k, v in env.items()},
            test_cmd=str(record.get("test_cmd") or DEFAULT_TEST_CMD),
            image=image,
            repo_dir=os.path.normpath(repo_dir),
            setup_patch=str(record.get("setup_patch") or ""),
            extra={k: v for k, v in record.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The SWE-bench record (test lists as JSON lists)."""
        record = dict(self.extra)
        record.update(
            instance_id=self.instance_id,
            repo=self.repo,
            base_commit=self.base_commit,
            problem_statement=self.problem_statement,
            patch=self.patch,
            test_patch=self.test_patch,
            FAIL_TO_PASS=list(self.fail_to_pass),
            PASS_TO_PASS=list(self.pass_to_pass),
            repo_path=self.repo_path,
            env=dict(self.env),
            test_cmd=self.test_cmd,
        )
        if self.image:
            record.update(image=self.image, repo_dir=self.repo_dir)
        if self.setup_patch:
            record.update(setup_patch=self.setup_patch)
        return record


def _test_list(record: dict[str, Any], key: str) -> tuple[str, ...]:
    """A test-id list that may be a list or a JSON-encoded string of one (as in SWE-bench)."""
    value = record[key]
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise ValueError(
                f"instance {record['instance_id']}: {key} is a string but not a JSON list: "
                f"{value[:80]!r} ({e})"
            ) from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(
            f"instance {record['instance_id']}: {key} must be a list of test ids, got {value!r}"
        )
    return tuple(value)


def read_json_records(path: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (blank lines skipped) or of a JSON list."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return list(json.loads(text))
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
    return records


def load_jsonl(path: str) -> list[SweInstance]:
    """Reads instances from a JSONL file (blank lines skipped); relative repo_paths are
    resolved against the file's directory."""
    base_dir = os.path.dirname(os.path.abspath(path))
    instances = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
            instances.append(SweInstance.from_dict(record, base_dir=base_dir))
    ids = [inst.instance_id for inst in instances]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate instance_id(s) {duplicates}")
    return instances


def dump_jsonl(instances: Iterable[SweInstance], path: str) -> None:
    """Writes instances as JSONL, one SWE-bench record per line."""
    with open(path, "w", encoding="utf-8") as f:
        for inst in instances:
            f.write(json.dumps(inst.to_dict()) + "\n")


def load_predictions(path: str) -> dict[str, str]:
    """Reads SWE-bench predictions (JSONL, or a JSON list) into {instance_id: model_patch}."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    records: Sequence[Any]
    if stripped.startswith("["):
        records = json.loads(text)
    else:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    predictions = {}
    for record in records:
        if not isinstance(record, dict) or "instance_id" not in record:
            raise ValueError(
                f"{path}: each prediction needs instance_id and model_patch: {record!r}"
            )
        predictions[str(record["instance_id"])] = record.get("model_patch") or ""
    return predictions
