"""A directory of images found by name: `docker save` tarballs and OCI layouts, by tag.

    store = ImageStore("/data/images")            # env.images / swe_eval --images
    store.resolve("swebench/sweb.eval.x86_64.django_1776_django-11099:latest")
    # -> "/data/images/django.tar:swebench/sweb.eval.x86_64.django_1776_django-11099:latest"

Every image directly under the directory is indexed by its tags: `RepoTags` of a tarball's
manifest.json, `org.opencontainers.image.ref.name` of an OCI layout's index.json (a layout
directory or a tarball of one). The result is a string `open_image` and the rootfs cache
read as usual (`PATH:TAG`). Names are compared normalized: `docker.io/` and `library/`
dropped, `:latest` added when no tag is given, so `swebench/x` finds `docker.io/swebench/x:latest`.
The index is kept in DIR/.tsj-tags.json, keyed by each file's size and mtime, so a store
of hundreds of tarballs is read once. `python -m thundersync_jax.envs.images import|list`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tarfile

from thundersync_jax.envs.images.layout import ImageError

INDEX_FILE = ".tsj-tags.json"
_REF_NAME = "org.opencontainers.image.ref.name"


def normalize(name: str) -> str:
    """The canonical form of an image name: no docker.io/ or library/ prefix, a tag."""
    name = name.strip()
    if "@" in name:
        return name
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        name = name.removeprefix(prefix)
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else name + ":latest"


def swebench_image_name(instance_id: str, namespace: str = "swebench") -> str:
    """The SWE-bench harness's instance image name: `__` is not allowed in a docker name,
    so it becomes `_1776_`, all lowercase (swebench/sweb.eval.x86_64.django_1776_django-1)."""
    key = instance_id.replace("__", "_1776_").lower()
    return f"{namespace}/sweb.eval.x86_64.{key}:latest"


class ImageStore:
    """The images of one directory, by tag (see the module doc).

    Args:
      root: the directory; every `*.tar` file and every OCI layout directory (one with an
        index.json) directly in it is an image file.
    """

    def __init__(self, root: str):
        if not os.path.isdir(root):
            raise ImageError(f"image store {root!r} is not a directory")
        self.root = os.path.abspath(root)
        self._refs: dict[str, tuple[str, str]] | None = None

    def tags(self) -> dict[str, str]:
        """{normalized tag: image file path} of every image in the store."""
        return {tag: path for tag, (path, _) in self._index().items()}

    def _index(self) -> dict[str, tuple[str, str]]:
        """{normalized tag: (image file path, the tag as that file spells it)}."""
        if self._refs is None:
            self._refs = self._scan()
        return self._refs

    def resolve(self, name: str) -> str | None:
        """`PATH:TAG` of the image tagged `name`, or None when the store has none."""
        found = self._index().get(normalize(name))
        return f"{found[0]}:{found[1]}" if found else None

    def resolve_swebench(self, instance_id: str) -> str | None:
        """The SWE-bench image of an instance under any namespace (swebench/, xingyaoww/
        for SWE-Gym, ...): swebench/ first, then the only other one that matches."""
        exact = self.resolve(swebench_image_name(instance_id))
        if exact is not None:
            return exact
        suffix = "/" + swebench_image_name(instance_id).split("/", 1)[1]
        found = sorted(t for t in self._index() if t.endswith(suffix) or "/" + t == suffix)
        return self.resolve(found[0]) if len(found) == 1 else None

    def _scan(self) -> dict[str, tuple[str, str]]:
        index_path = os.path.join(self.root, INDEX_FILE)
        with open(index_path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(index_path) as f:
                    known = json.load(f)
            except (OSError, json.JSONDecodeError):
                known = {}
            files = {}
            for name in sorted(os.listdir(self.root)):
                path = os.path.join(self.root, name)
                if name.startswith(".") or not _is_image_file(path):
                    continue
                stamp = _stamp(path)
                entry = known.get(name)
                tags = entry["tags"] if entry and entry.get("stamp") == stamp else image_tags(path)
                files[name] = {"stamp": stamp, "tags": tags}
            if files != known:
                tmp = f"{index_path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump(files, f, indent=0, sort_keys=True)
                os.replace(tmp, index_path)
        out: dict[str, tuple[str, str]] = {}
        for name, entry in files.items():
            for tag in entry["tags"]:  # the file's own spelling: open_image matches on it
                out.setdefault(normalize(tag), (os.path.join(self.root, name), tag))
        return out


def _is_image_file(path: str) -> bool:
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "index.json"))
    return path.endswith(".tar") and os.path.isfile(path)


def _stamp(path: str) -> list[int]:
    target = os.path.join(path, "index.json") if os.path.isdir(path) else path
    st = os.stat(target)
    return [st.st_size, st.st_mtime_ns]


def image_tags(path: str) -> list[str]:
    """The tags an image file carries (RepoTags, or OCI ref names); [] when it has none."""
    if os.path.isdir(path):
        with open(os.path.join(path, "index.json")) as f:
            return _oci_tags(json.load(f))
    try:
        with tarfile.open(path) as tar:
            names = {os.path.normpath(n): n for n in tar.getnames()}
            for member in ("manifest.json", "index.json"):
                if member in names:
                    data = json.load(tar.extractfile(names[member]))
                    if member == "manifest.json":
                        return [t for e in data for t in e.get("RepoTags") or [] if t]
                    return _oci_tags(data)
    except (tarfile.TarError, json.JSONDecodeError, OSError) as e:
        raise ImageError(f"{path}: cannot read its tags ({e})") from None
    raise ImageError(f"{path}: neither a docker save tarball nor an OCI layout")


def _oci_tags(index: dict) -> list[str]:
    names = [(m.get("annotations") or {}).get(_REF_NAME, "") for m in index.get("manifests", [])]
    return [n for n in names if n]


def import_image(source: str, store_dir: str) -> tuple[str, list[str]]:
    """Copies an image file (tarball or OCI layout directory) into the store; returns
    (its path there, its tags). Hard-links a tarball on the same file system."""
    tags = image_tags(source)
    if not tags:
        raise ImageError(f"{source}: the image has no tag, so no dataset row can name it")
    os.makedirs(store_dir, exist_ok=True)
    dest = os.path.join(store_dir, os.path.basename(os.path.normpath(source)))
    if os.path.lexists(dest):
        raise ImageError(f"{dest} exists already; remove it or rename the file to import")
    if os.path.isdir(source):
        shutil.copytree(source, dest + ".importing", symlinks=False)
        os.rename(dest + ".importing", dest)
    else:
        try:
            os.link(source, dest)
        except OSError:
            shutil.copyfile(source, dest + ".importing")
            os.rename(dest + ".importing", dest)
    return dest, tags
