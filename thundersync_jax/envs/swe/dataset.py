"""SWE task datasets as published: SWE-bench, SWE-bench Verified, SWE-Gym and SWE-smith.

    instances = dataset.load("data/swe-smith.parquet", images="/data/images")
    instances = dataset.load("hf:SWE-bench/SWE-bench_Verified:test", images=...)  # offline

A dataset is a `.jsonl`, `.json` or `.parquet` file, a `datasets.save_to_disk` directory,
or `hf:ORG/NAME[:SPLIT]` from the Hugging Face cache (read with HF_HUB_OFFLINE=1: nothing
is downloaded). Every format is read by the `datasets` library.

Row formats (`detect_format`, or named with `fmt`):
  swe-bench  (SWE-bench, SWE-bench Verified, SWE-Gym): base_commit, the gold `patch`,
             `test_patch`, FAIL_TO_PASS / PASS_TO_PASS as JSON strings or lists. The image
             is the row's `image` path, else, with a store, the SWE-bench harness's name
             for the instance (`images.swebench_image_name`, any namespace).
  swe-smith  no base_commit: `image_name` names a prebuilt image whose /testbed holds the
             clean repository; `patch` *introduces* the bug. At reset the bug is applied
             and committed (`SweInstance.setup_patch`), the gold fix is that patch reversed,
             and FAIL_TO_PASS / PASS_TO_PASS (lists) run inside the image.

Every row is checked, and every image resolved, before anything starts: the errors come
together in one ValueError naming each row and field (or each missing image).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from thundersync_jax.envs.images.store import ImageStore, swebench_image_name
from thundersync_jax.envs.swe import instance as instance_lib
from thundersync_jax.envs.swe import repo
from thundersync_jax.envs.swe.instance import SweInstance

FORMATS = ("auto", "swe-bench", "swe-bench-verified", "swe-gym", "swe-smith")
_SMITH_REQUIRED = ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image_name")
_MAX_LISTED = 20  # errors listed in one message


def read_rows(spec: str) -> tuple[list[dict[str, Any]], str]:
    """(the rows of the dataset `spec` as dicts, the directory relative paths resolve against)."""
    if spec.startswith("hf:"):
        return _hub_rows(spec[3:]), ""
    if not os.path.exists(spec):
        raise ValueError(f"dataset {spec!r} not found (a .jsonl/.json/.parquet file, a "
                         "save_to_disk directory, or hf:ORG/NAME[:SPLIT])")  # fmt: skip
    import datasets

    base_dir = os.path.dirname(os.path.abspath(spec))
    if os.path.isdir(spec):
        return _split_rows(datasets.load_from_disk(spec), "", spec), os.path.abspath(spec)
    with tempfile.TemporaryDirectory(prefix="tsj-dataset-") as cache:
        if spec.endswith(".parquet"):
            return datasets.Dataset.from_parquet(spec, cache_dir=cache).to_list(), base_dir
        if spec.endswith((".jsonl", ".json")):
            return _json_rows(spec, cache), base_dir
        raise ValueError(f"dataset {spec!r}: use a .jsonl, .json or .parquet file")


def _json_rows(path: str, cache: str) -> list[dict[str, Any]]:
    import datasets
    import pyarrow

    try:
        return datasets.Dataset.from_json(path, cache_dir=cache).to_list()
    except (pyarrow.ArrowInvalid, datasets.exceptions.DatasetGenerationError):
        # Rows whose fields change type (a list here, a JSON string there) have no one
        # Arrow schema, yet are valid SWE-bench JSONL: read them record by record.
        return instance_lib.read_json_records(path)


def _hub_rows(name: str) -> list[dict[str, Any]]:
    """Rows of a hub dataset from the local caches: the `datasets` cache of an earlier
    `load_dataset`, else the hub cache's snapshot of the repository (`snapshot_download`)."""
    import datasets

    repo_id, _, split = name.partition(":")
    try:
        return _split_rows(datasets.load_dataset(repo_id, split=split or None), split, name)
    except Exception as e:  # not in the datasets cache: try the hub cache's files
        first = f"{type(e).__name__}: {e}"
    with tempfile.TemporaryDirectory(prefix="tsj-dataset-") as cache:
        try:
            files = _snapshot_files(repo_id)
        except Exception as e:  # offline and not cached either: say which and how
            raise ValueError(
                f"dataset hf:{name}: not in the Hugging Face cache ({first}; hub cache: "
                f"{type(e).__name__}); download it once with network access, then run with "
                "HF_HUB_OFFLINE=1"
            ) from None
        kind = "parquet" if files[0].endswith(".parquet") else "json"
        by_split: dict[str, list[str]] = {}
        for f in files:
            by_split.setdefault(os.path.basename(f).split("-")[0].split(".")[0], []).append(f)
        loaded = datasets.load_dataset(kind, data_files=by_split, cache_dir=cache)
        return _split_rows(loaded, split, f"hf:{name}")


def _snapshot_files(repo_id: str) -> list[str]:
    """The data files (parquet, else JSON lines) of the cached snapshot of a hub dataset."""
    import huggingface_hub

    root = huggingface_hub.snapshot_download(repo_id, repo_type="dataset", local_files_only=True)
    for ext in (".parquet", ".jsonl", ".json"):
        found = sorted(
            os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f.endswith(ext)
        )
        if found:
            return found
    raise FileNotFoundError(f"no .parquet/.jsonl/.json files in {root}")


def _split_rows(loaded, split: str, where: str) -> list[dict[str, Any]]:
    if hasattr(loaded, "to_list"):
        return loaded.to_list()
    splits = list(loaded)
    if not split and len(splits) == 1:
        split = splits[0]
    if split not in splits:
        raise ValueError(f"dataset {where}: name a split ({', '.join(splits)})")
    return loaded[split].to_list()


def detect_format(row: dict[str, Any]) -> str:
    """ "swe-smith" for a row with image_name and no base_commit, else "swe-bench"."""
    return "swe-smith" if row.get("image_name") and not row.get("base_commit") else "swe-bench"


def load(spec: str, *, images: str = "", fmt: str = "auto", limit: int = 0) -> list[SweInstance]:
    """The instances of dataset `spec` (see the module doc), every image resolved.

    Args:
      spec: the dataset.
      images: an image store directory (rows name their images by tag); "" = rows carry
        image paths themselves, or none.
      fmt: one of FORMATS ("auto": per row, `detect_format`).
      limit: keep the first `limit` rows (0 = all).
    """
    if fmt not in FORMATS:
        raise ValueError(f"dataset format {fmt!r}; valid: {', '.join(FORMATS)}")
    rows, base_dir = read_rows(spec)
    if limit > 0:
        rows = rows[:limit]
    if not rows:
        raise ValueError(f"dataset {spec}: no rows")
    store = ImageStore(images) if images else None
    instances, errors, missing = [], [], {}
    for i, row in enumerate(rows):
        try:
            inst, image_name = _instance(row, fmt, base_dir, store)
        except ValueError as e:
            errors.append(f"row {i} ({row.get('instance_id', '<no instance_id>')}): {e}")
            continue
        if image_name is not None:
            missing.setdefault(image_name, []).append(inst.instance_id)
        instances.append(inst)
    _raise_problems(spec, errors, missing, images)
    counts = collections.Counter(inst.instance_id for inst in instances)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    if duplicates:
        raise ValueError(f"dataset {spec}: duplicate instance_id(s) {duplicates[:_MAX_LISTED]}")
    return instances


def _raise_problems(spec: str, errors: list[str], missing: dict, images: str) -> None:
    if errors:
        shown = "\n  ".join(errors[:_MAX_LISTED])
        more = f"\n  ... and {len(errors) - _MAX_LISTED} more" if len(errors) > _MAX_LISTED else ""
        raise ValueError(f"dataset {spec}: {len(errors)} malformed row(s):\n  {shown}{more}")
    if missing:
        lines = [f"{name} (rows {', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''})"
                 for name, ids in sorted(missing.items())]  # fmt: skip
        shown = "\n  ".join(lines[:_MAX_LISTED])
        more = f"\n  ... and {len(lines) - _MAX_LISTED} more" if len(lines) > _MAX_LISTED else ""
        where = f"the image store {images}" if images else "no image store (env.images / --images)"
        raise ValueError(
            f"dataset {spec}: {len(missing)} image(s) not found in {where}:\n  {shown}{more}\n"
            "add them with `python -m thundersync_jax.envs.images import FILE --store DIR`"
        )


def _instance(
    row: dict[str, Any], fmt: str, base_dir: str, store: ImageStore | None
) -> tuple[SweInstance, str | None]:
    """(the row's instance, the image name it lacks or None)."""
    kind = detect_format(row) if fmt == "auto" else fmt
    if kind == "swe-smith":
        return _smith_instance(row, base_dir, store)
    record = {k: v for k, v in row.items() if v is not None}
    inst = SweInstance.from_dict(_named_fields(record), base_dir=base_dir)
    if inst.image or inst.repo_path or store is None:
        return inst, None
    name = row.get("image_name") or ""
    found = store.resolve(name) if name else store.resolve_swebench(inst.instance_id)
    if found is None:
        return inst, name or swebench_image_name(inst.instance_id)
    return _with(inst, image=found), None


def _smith_instance(
    row: dict[str, Any], base_dir: str, store: ImageStore | None
) -> tuple[SweInstance, str | None]:
    absent = [k for k in _SMITH_REQUIRED if row.get(k) is None]
    if absent:
        raise ValueError(f"missing field(s) {absent} (SWE-smith rows need {_SMITH_REQUIRED})")
    for key in ("instance_id", "repo", "patch", "image_name"):
        if not isinstance(row[key], str) or not row[key].strip():
            raise ValueError(f"field {key} must be a non-empty string, got {row[key]!r}")
    try:
        gold = repo.reverse_patch(row["patch"])
    except ValueError as e:
        raise ValueError(f"field patch: {e}") from None
    if not repo.patched_paths(row["patch"]):
        raise ValueError("field patch: not a unified diff (no file header)")
    record = {k: v for k, v in row.items() if v is not None and k != "patch"}
    record.update(
        base_commit=row.get("base_commit") or "HEAD",
        patch=gold,
        setup_patch=row["patch"],
        test_patch=row.get("test_patch") or "",
        problem_statement=row.get("problem_statement") or "",
    )
    inst = SweInstance.from_dict(_named_fields(record), base_dir=base_dir)
    if inst.image or store is None:
        return inst, None if inst.image else row["image_name"]
    found = store.resolve(row["image_name"])
    return (_with(inst, image=found), None) if found else (inst, row["image_name"])


def _named_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its test lists checked here, so the error names the field."""
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = record.get(key)
        if isinstance(value, Sequence) and not isinstance(value, str):
            record[key] = [str(t) for t in value]
    env = record.get("env")
    if isinstance(env, dict):  # Arrow gives every row every key seen in the column: None
        record["env"] = {k: v for k, v in env.items() if v is not None}
    return record


def _with(inst: SweInstance, **changes) -> SweInstance:
    return dataclasses.replace(inst, **changes)
