"""Make and check images for SWE instances (no registry, no daemon).

    python -m thundersync_jax.envs.images build --from-instances I.jsonl --out DIR \
        [--format oci|docker|both] [--python EXE]
    python -m thundersync_jax.envs.images inspect IMAGE [--cache DIR] [--unpack]
    python -m thundersync_jax.envs.images import FILE [FILE ...] --store DIR
    python -m thundersync_jax.envs.images list --store DIR

`build` makes one image per repository of I.jsonl from the host's interpreter
(python_image.py: loader and libraries, a few shell tools, the interpreter and
stdlib, pytest and its requirements, the repository at /testbed) and writes
DIR/<owner__name> (OCI layout) and/or DIR/<owner__name>.tar (`docker save`), plus
DIR/instances.jsonl: the instances with `image` set (relative to DIR) and no
`repo_path` (the image holds the repository). The layers below the repository are
the same for every repository, so they are stored and unpacked once.

`inspect` prints the format, the layers (diff_id, blob digest, size), Env,
WorkingDir, the cache key and whether (and where) the cache holds it unpacked;
`--unpack` unpacks it first and prints how long that took.

`import` puts `docker save` tarballs or OCI layouts into an image store (store.py), where
datasets find them by tag (`env.images=DIR`, `swe_eval --images DIR`); `list` prints
every tag of a store and the file holding it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence

from thundersync_jax.envs.images import build, layout, python_image, store
from thundersync_jax.envs.images import cache as cache_lib


def build_from_instances(
    instances_path: str,
    out_dir: str,
    formats: Sequence[str] = ("oci",),
    python: str = "",
    base: tuple[list[build.LayerBlob], dict[str, str]] | None = None,
) -> str:
    """Builds the images for every repository of `instances_path`; returns the path of the
    rewritten instances JSONL in `out_dir`.

    Args:
      instances_path: SWE-bench-format JSONL.
      out_dir: where the images and the rewritten JSONL go.
      formats: "oci" and/or "docker".
      python: interpreter to package (default: this one).
      base: (layers, env) of `python_image.base_layers` already written, to reuse.
    """
    from thundersync_jax.envs.swe import instance as instance_lib
    from thundersync_jax.envs.swe import verifier

    bad = [f for f in formats if f not in ("oci", "docker")]
    if bad or not formats:
        raise ValueError(f"formats must be among ('oci', 'docker'), got {list(formats)}")
    instances = instance_lib.load_jsonl(instances_path)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="images-build-", dir=out_dir) as work:
        base_layers, env = base or python_image.base_layers(work, python or sys.executable)
        images: dict[str, str] = {}
        for inst in instances:
            if inst.repo in images:
                continue
            slug = re.sub(r"[^\w.-]", "__", inst.repo) or inst.instance_id
            source = verifier.source_repo(inst, os.path.join(work, "mirrors"))
            layers = [*base_layers, python_image.repository_layer(source, work, inst.repo_dir)]
            config = build.image_config(layers, env, inst.repo_dir)
            tag = f"{slug.lower()}:latest"
            if "oci" in formats:
                target = os.path.join(out_dir, slug)
                shutil.rmtree(target, ignore_errors=True)
                build.write_oci_layout(target, layers, config, tag)
                images[inst.repo] = slug
            if "docker" in formats:
                build.write_docker_archive(
                    os.path.join(out_dir, slug + ".tar"), layers, config, tag
                )
                images.setdefault(inst.repo, slug + ".tar")
        rewritten = [
            dataclasses.replace(inst, image=images[inst.repo], repo_path="") for inst in instances
        ]
    out = os.path.join(out_dir, "instances.jsonl")
    instance_lib.dump_jsonl(rewritten, out)
    return out


def inspect(image: str, cache: cache_lib.ImageCache, unpack: bool = False) -> str:
    """A human-readable description of `image` and its cache entry."""
    source = layout.open_image(image)
    lines = [f"image    {source.path}" + (f" ({source.ref})" if source.ref else "")]
    lines.append(f"format   {source.format}")
    lines.append(f"config   {source.config_digest or '(unnamed)'}")
    total = 0
    for i, layer in enumerate(source.layers):
        total += layer.size
        lines.append(
            f"layer {i}  {layer.diff_id}  blob {layer.digest or '-'}  {layer.size / 1e6:.1f} MB"
        )
    lines.append(f"size     {total / 1e6:.1f} MB stored in {len(source.layers)} layers")
    lines.append(f"env      {' '.join(f'{k}={v}' for k, v in source.env.items())}")
    lines.append(f"workdir  {source.working_dir or '(unset)'}")
    if unpack:
        got = cache.unpack(source)
        how = "unpacked" if got.unpacked_now else "found in cache"
        lines.append(f"unpack   {how} in {got.seconds:.2f} s")
    key = cache_lib.chain_key(source.diff_ids)
    entry = cache.entry_dir(key)
    if os.path.isdir(entry):
        size = next(e.size_bytes for e in cache.entries() if e.key == key)
        lines.append(f"cache    {entry}/rootfs ({size / 1e6:.1f} MB unpacked)")
    else:
        lines.append(f"cache    not unpacked yet (key {key}, under {cache.root})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m thundersync_jax.envs.images",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build one image per repository of an instances JSONL")
    b.add_argument("--from-instances", required=True, help="SWE-bench-format JSONL")
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--format", choices=("oci", "docker", "both"), default="oci")
    b.add_argument("--python", default="", help="interpreter to package (default: this one)")
    i = sub.add_parser("inspect", help="print an image's layers, size and cache entry")
    i.add_argument("image", help="OCI layout dir or docker-save tarball [:TAG|@DIGEST]")
    i.add_argument("--cache", default="", help="rootfs cache (default $TSJ_IMAGE_CACHE)")
    i.add_argument("--unpack", action="store_true", help="unpack into the cache first")
    im = sub.add_parser("import", help="copy image files into a store, indexed by their tags")
    im.add_argument("files", nargs="+", help="docker-save tarballs or OCI layout directories")
    im.add_argument("--store", required=True, help="the store directory")
    ls = sub.add_parser("list", help="print a store's tags and their files")
    ls.add_argument("--store", required=True, help="the store directory")
    args = p.parse_args(argv)
    if args.command in ("import", "list"):
        return _store_command(args)
    if args.command == "build":
        formats = ("oci", "docker") if args.format == "both" else (args.format,)
        start = time.monotonic()
        out = build_from_instances(args.from_instances, args.out, formats, args.python)
        print(f"built images in {time.monotonic() - start:.1f} s; instances: {out}")
        return 0
    cache = cache_lib.ImageCache(args.cache) if args.cache else cache_lib.default_cache()
    try:
        print(inspect(args.image, cache, unpack=args.unpack))
    except layout.ImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _store_command(args) -> int:
    try:
        if args.command == "import":
            for path in args.files:
                dest, tags = store.import_image(path, args.store)
                print(f"{dest}: {' '.join(tags)}")
        for tag, path in sorted(store.ImageStore(args.store).tags().items()):
            if args.command == "list":
                print(f"{tag}\t{os.path.relpath(path, args.store)}")
    except layout.ImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
