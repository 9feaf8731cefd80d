"""The SWE-bench verifier: score a model patch by the instance's tests, in the sandbox.

Harness order (as SWE-bench): a fresh checkout of base_commit, the model patch,
the test files of `test_patch` reset to base_commit (a model may not edit the
tests that judge it), `test_patch`, then FAIL_TO_PASS + PASS_TO_PASS run with
`test_cmd` inside a Sandbox. Resolved when every one of them passes. An instance
with an `image` runs its tests inside that image (swe/image_sandbox.py); GNU patch,
which only needs the workspace, runs on the host toolchain either way.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from thundersync_jax.envs.base import VerifierResult
from thundersync_jax.envs.images import cache as image_cache_lib
from thundersync_jax.envs.sandbox import RunResult, Sandbox
from thundersync_jax.envs.swe import image_sandbox, pytest_report, repo
from thundersync_jax.envs.swe.instance import SweInstance

DEFAULT_SANDBOX = {"timeout_s": 60.0, "memory_mb": 2048}
_OUTPUT_TAIL = 3000
_PATCH_FILE = ".tsj-model.patch"  # written into the workspace for the in-box GNU patch


def source_repo(
    instance: SweInstance, cache_dir: str, image: image_cache_lib.UnpackedImage | None = None
) -> str:
    """The local repository holding the instance's base_commit: `repo_path`, else the one
    the instance's image keeps at repo_dir (a snapshot of its files when the image holds
    them without .git; base_commit is then HEAD), else a mirror of `repo` (cloned once)."""
    if instance.repo_path:
        return instance.repo_path
    in_image = image_sandbox.repository_in_image(instance, image)
    if in_image is not None:
        return in_image
    tree = image_sandbox.tree_in_image(instance, image)
    if tree is not None:  # the repository without its history: one snapshot commit
        return repo.snapshot(tree, os.path.join(cache_dir, "snapshots", image.key + ".git"))
    return repo.mirror(instance.repo, cache_dir)


def checkout_task(instance: SweInstance, source: str, scratch: str) -> repo.Workspace:
    """base_commit of `source` checked out under scratch/repo (git data in scratch/git),
    with the instance's setup_patch committed on top when it has one."""
    ws = repo.checkout(
        source,
        instance.base_commit,
        os.path.join(scratch, "repo"),
        os.path.join(scratch, "git"),
    )
    if instance.setup_patch:
        ws = repo.commit_patch(ws, instance.setup_patch, f"task {instance.instance_id}")
    return ws


def test_command(instance: SweInstance, test_ids: Sequence[str]) -> str:
    """`test_cmd` with the pytest report flag and the shell-quoted test ids appended."""
    cmd = instance.test_cmd
    if "pytest" in cmd and not re.search(r"(^|\s)-r\S*A", cmd):
        cmd += " -rA"
    return " ".join([cmd, *(shlex.quote(t) for t in test_ids)])


def run_tests(
    sandbox: Sandbox, instance: SweInstance, test_ids: Sequence[str], timeout_s: float | None = None
) -> tuple[dict[str, str], list[RunResult]]:
    """Runs `test_ids` and returns {id: PASSED|FAILED|ERROR} plus the raw runs.

    When pytest rejects an id it cannot find (it then runs nothing at all), the
    test files are run whole and the ids looked up in that report. Ids that no
    report mentions are ERROR (they never produced a result).
    """
    runs = [sandbox.run(test_command(instance, test_ids), timeout_s=timeout_s)]
    statuses = pytest_report.parse_statuses(runs[0].stdout, test_ids)
    missing = [t for t in test_ids if t not in statuses]
    first = runs[0].stdout + runs[0].stderr
    if missing and not runs[0].timed_out and (runs[0].exit_code == 4 or "not found:" in first):
        files = list(dict.fromkeys(t.split("::", 1)[0] for t in missing))
        runs.append(sandbox.run(test_command(instance, files), timeout_s=timeout_s))
        statuses.update(pytest_report.parse_statuses(runs[1].stdout, missing))
    return {t: statuses.get(t, pytest_report.ERROR) for t in test_ids}, runs


def apply_model_patch(ws: repo.Workspace, patch: str, sandbox_config: Mapping[str, Any]) -> str:
    """Applies `patch` to the workspace; returns "" on success, else why it does not apply.

    `git apply` first; then, as the SWE-bench harness does, GNU patch with fuzz so
    slightly shifted context still applies. GNU patch runs inside the sandbox (dry run
    first, so a failure leaves no half-applied files): it is the less careful of the
    two about where an untrusted patch may write.
    """
    try:
        ws.apply(patch)
        return ""
    except repo.GitError as e:
        git_error = str(e)
    patch_file = os.path.join(ws.path, _PATCH_FILE)
    with open(patch_file, "w") as f:
        f.write(patch if patch.endswith("\n") else patch + "\n")
    try:
        with Sandbox(ws.path, **sandbox_config) as sb:
            fuzzy = f"patch --batch --fuzz=5 -p1 -i {_PATCH_FILE}"
            res = sb.run(f"{fuzzy} --dry-run && {fuzzy}", timeout_s=60)
    finally:
        os.remove(patch_file)
    if res.exit_code == 0 and not res.timed_out:
        return ""
    return f"{git_error}; patch --fuzz=5: {(res.stdout + res.stderr).strip()[-300:]}"


def evaluate_patch(
    instance: SweInstance,
    model_patch: str,
    workdir: str,
    sandbox_config: Mapping[str, Any] | None = None,
    *,
    partial_credit: bool = False,
    cache_dir: str | None = None,
    timeout_s: float | None = None,
    image_cache: image_cache_lib.ImageCache | None = None,
) -> VerifierResult:
    """Scores `model_patch` on `instance`: reward 1 when every FAIL_TO_PASS and PASS_TO_PASS
    test passes, else 0 (or the fraction passing with `partial_credit`).

    A patch that does not apply gives reward 0 with the reason, not an exception.
    Problems of the instance itself (bad base_commit, test_patch not applying) raise.

    Args:
      instance: the task.
      model_patch: a unified diff against base_commit ("" = no change).
      workdir: scratch space; a fresh checkout is made under it and removed after.
      sandbox_config: keyword arguments of `Sandbox` (timeout_s, memory_mb, ...).
      partial_credit: reward the fraction of tests passing instead of all-or-nothing.
      cache_dir: where remote repositories are mirrored (default workdir/repos).
      timeout_s: wall-clock limit of one test run (default: the sandbox's).
      image_cache: where the instance's image is unpacked (default images' default cache).
    """
    with image_sandbox.held_image(instance, image_cache) as image:
        return _evaluate_in(
            instance,
            model_patch,
            workdir,
            sandbox_config,
            partial_credit,
            cache_dir,
            timeout_s,
            image,
        )


def _evaluate_in(
    instance, model_patch, workdir, sandbox_config, partial_credit, cache_dir, timeout_s, image
) -> VerifierResult:
    os.makedirs(workdir, exist_ok=True)
    source = source_repo(instance, cache_dir or os.path.join(workdir, "repos"), image)
    scratch = tempfile.mkdtemp(prefix="eval-", dir=workdir)
    try:
        ws = checkout_task(instance, source, scratch)
        base = {**DEFAULT_SANDBOX, **(sandbox_config or {})}
        config = image_sandbox.sandbox_config(instance, base, None)
        dropped: list[str] = []
        editable = instance.extra.get("editable_paths")
        if editable:
            # Only the code under test is the model's to change (mini-SWE: the package):
            # edits to conftest.py, pytest.ini or other tests would let it fake a pass.
            model_patch, dropped = repo.restrict_patch(model_patch, editable)
        problem = apply_model_patch(ws, model_patch, config)
        if problem:
            return VerifierResult(
                reward=0.0,
                reason=f"model patch does not apply: {problem}",
                details={"resolved": False, "patch_applied": False, "tests": {}},
            )
        ws.reset_files(repo.patched_paths(instance.test_patch))
        try:
            ws.apply(instance.test_patch)
        except repo.GitError as e:
            raise repo.GitError(f"instance {instance.instance_id}: test_patch: {e}") from None
        # A fresh box: it re-owns the files the host just wrote for the sandbox user.
        with Sandbox(ws.path, **image_sandbox.sandbox_config(instance, base, image)) as sb:
            tests, runs = run_tests(sb, instance, instance.test_ids, timeout_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = score(instance, tests, runs, partial_credit)
    if dropped:
        result.details["ignored_paths"] = dropped
    return result


def score(
    instance: SweInstance, tests: dict[str, str], runs: list[RunResult], partial_credit: bool
) -> VerifierResult:
    """The VerifierResult of per-test statuses (all pass = resolved)."""
    passed = [t for t in instance.test_ids if tests.get(t) == pytest_report.PASSED]
    resolved = len(passed) == len(instance.test_ids)
    f2p_failing = [t for t in instance.fail_to_pass if tests.get(t) != pytest_report.PASSED]
    p2p_failing = [t for t in instance.pass_to_pass if tests.get(t) != pytest_report.PASSED]
    if resolved:
        reason = f"resolved: all {len(passed)} tests pass"
    else:
        reason = f"unresolved: FAIL_TO_PASS {len(f2p_failing)} failing, PASS_TO_PASS " + (
            f"{len(p2p_failing)} failing"
        )
        if any(r.timed_out for r in runs):
            reason += " (test run timed out)"
    if resolved:
        reward = 1.0
    elif partial_credit and instance.test_ids:
        reward = len(passed) / len(instance.test_ids)
    else:
        reward = 0.0
    output = "\n".join(r.stdout + r.stderr for r in runs)
    return VerifierResult(
        reward=reward,
        reason=reason,
        details={
            "resolved": resolved,
            "patch_applied": True,
            "tests": tests,
            "timed_out": any(r.timed_out for r in runs),
            "exit_codes": [r.exit_code for r in runs],
            "output_tail": output[-_OUTPUT_TAIL:],
        },
    )
