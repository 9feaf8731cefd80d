"""Reading container images from disk: OCI image layouts and `docker save` tarballs.

An image is named by a path and an optional reference: `DIR`, `DIR:TAG`,
`DIR@sha256:HEX`, `FILE.tar`, `FILE.tar:TAG` (the path part is whatever exists on
disk; a tag may be `TAG` or `NAME:TAG`). Nothing is fetched from a registry.

Both formats end up as one `ImageSource`: the config (Env, WorkingDir, the layers'
uncompressed digests `diff_ids`) and the layers in order, each readable as a stream
that verifies its digests as it is read (`LayerReader`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tarfile
import zlib
from collections.abc import Callable
from typing import IO, Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REF_NAME = "org.opencontainers.image.ref.name"
_PLATFORM = {"os": "linux", "architecture": "amd64"}


class ImageError(ValueError):
    """An image cannot be read: missing file, unknown reference, bad JSON, wrong digest."""


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer of an image.

    Attributes:
      diff_id: sha256 of the uncompressed tar (the config's rootfs.diff_ids entry).
      digest: sha256 of the stored blob as the manifest names it ("" when the format
        does not name one, as the legacy `docker save` layout).
      size: bytes of the stored blob.
      open: returns a fresh binary stream of the stored blob.
    """

    diff_id: str
    digest: str
    size: int
    open: Callable[[], IO[bytes]]


@dataclasses.dataclass(frozen=True)
class ImageSource:
    """An image on disk, its chosen manifest read and checked.

    Attributes:
      path: the layout directory or tarball.
      ref: the reference asked for ("" = the only image there).
      format: "oci" or "docker-archive".
      layers: bottom first.
      env: the config's Env as a dict.
      working_dir: the config's WorkingDir ("" when unset).
      config_digest: sha256 of the config blob.
    """

    path: str
    ref: str
    format: str
    layers: tuple[Layer, ...]
    env: dict[str, str]
    working_dir: str
    config_digest: str

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple(layer.diff_id for layer in self.layers)


def split_reference(image: str) -> tuple[str, str]:
    """("path on disk", "tag or digest or ''") of an image string; see the module doc."""
    if os.path.exists(image):
        return image, ""
    for i in range(len(image) - 1, 0, -1):  # the longest existing path wins
        if image[i] in "@:" and os.path.exists(image[:i]):
            return image[:i], image[i + 1 :]
    raise ImageError(
        f"image {image!r} not found: expected an OCI layout directory or a `docker save` "
        "tarball, optionally followed by :TAG or @sha256:DIGEST"
    )


def open_image(image: str, ref: str = "") -> ImageSource:
    """Reads the manifest and config of `image` (see `split_reference`); `ref` overrides the
    reference in the string. Raises ImageError naming what is wrong."""
    path, in_string = split_reference(image)
    ref = ref or in_string
    if os.path.isdir(path):
        return _open_oci(path, ref, _DirBlobs(path))
    if not tarfile.is_tarfile(path):
        raise ImageError(f"image {path!r} is neither a directory nor a tar archive")
    archive = _TarBlobs(path)
    if "manifest.json" in archive.names:
        return _open_docker_archive(path, ref, archive)
    if "index.json" in archive.names:  # an OCI layout packed as a tar
        return _open_oci(path, ref, archive)
    raise ImageError(f"tarball {path!r} has neither manifest.json (docker save) nor index.json")


class LayerReader:
    """A layer blob as an uncompressed stream, checking its digests at the end.

    `read` passes the bytes of the tar; `finish()` reads what the tar reader left (the
    end-of-archive padding), then raises ImageError if the blob or the uncompressed
    content does not hash to the digests the image names.
    """

    def __init__(self, layer: Layer, label: str):
        self.layer, self.label = layer, label
        self._raw = layer.open()
        self._blob_hash = hashlib.sha256()
        self._diff_hash = hashlib.sha256()
        head = self._raw.read(4)
        self._blob_hash.update(head)
        self._blob = _Prepend(head, self._raw, self._blob_hash)
        self._stream: Any = self._blob
        if head[:2] == _GZIP_MAGIC:
            import gzip

            self._stream = gzip.GzipFile(fileobj=self._stream, mode="rb")
        elif head == _ZSTD_MAGIC:
            raise ImageError(f"{label}: zstd-compressed layers are not supported (use gzip)")

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._stream.read(n)
        except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip
            raise ImageError(f"{self.label}: cannot read the layer blob ({e})") from None
        self._diff_hash.update(data)
        return data

    def content_digest(self) -> str:
        """Reads the layer to its end and returns the sha256 of its uncompressed content."""
        while self.read(1 << 20):
            pass
        self._raw.close()
        return "sha256:" + self._diff_hash.hexdigest()

    def finish(self) -> None:
        while self.read(1 << 20):
            pass
        while self._blob.read(1 << 20):  # bytes after the gzip member count for the digest
            pass
        self._raw.close()
        blob = "sha256:" + self._blob_hash.hexdigest()
        diff = "sha256:" + self._diff_hash.hexdigest()
        if self.layer.digest and blob != self.layer.digest:
            raise ImageError(f"{self.label}: blob digest {blob} != manifest {self.layer.digest}")
        if diff != self.layer.diff_id:
            raise ImageError(f"{self.label}: content digest {diff} != diff_id {self.layer.diff_id}")


class _Prepend:
    """A stream that yields `head` then the rest of `raw`, hashing what it passes on."""

    def __init__(self, head: bytes, raw: IO[bytes], hasher):
        self._head, self._raw, self._hasher = head, raw, hasher

    def read(self, n: int = -1) -> bytes:
        if self._head:  # already hashed
            take = len(self._head) if n < 0 else n
            out, self._head = self._head[:take], self._head[take:]
            return out
        data = self._raw.read(n)
        self._hasher.update(data)
        return data


class _DirBlobs:
    def __init__(self, root: str):
        self.root = root

    def exists(self, rel: str) -> bool:
        return os.path.isfile(os.path.join(self.root, rel))

    def open(self, rel: str) -> IO[bytes]:
        full = os.path.join(self.root, rel)
        if not os.path.isfile(full):
            raise ImageError(f"{self.root}: missing {rel}")
        return open(full, "rb")

    def size(self, rel: str) -> int:
        return os.path.getsize(os.path.join(self.root, rel))


class _TarBlobs:
    """Members of a tarball by normalized name, opened on demand (one handle per open)."""

    def __init__(self, path: str):
        self.path = path
        with tarfile.open(path) as tar:
            self.members = {os.path.normpath(m.name): m for m in tar.getmembers() if m.isfile()}
        self.names = set(self.members)

    def exists(self, rel: str) -> bool:
        return os.path.normpath(rel) in self.members

    def open(self, rel: str) -> IO[bytes]:
        member = self.members.get(os.path.normpath(rel))
        if member is None:
            raise ImageError(f"{self.path}: missing member {rel}")
        f = open(self.path, "rb")
        f.seek(member.offset_data)
        return _Bounded(f, member.size)

    def size(self, rel: str) -> int:
        return self.members[os.path.normpath(rel)].size


class _Bounded:
    """The `size` bytes of an open file from its current position (a tar member)."""

    def __init__(self, f: IO[bytes], size: int):
        self._f, self._left = f, size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n)
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> _Bounded:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_json(blobs, rel: str, digest: str = "") -> Any:
    with blobs.open(rel) as f:
        data = f.read()
    if digest and "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ImageError(f"{rel}: content does not match its digest {digest}")
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ImageError(f"{rel}: not valid JSON ({e})") from None


def _blob_path(digest: str) -> str:
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ImageError(f"unsupported or malformed digest {digest!r} (want sha256:<64 hex>)")
    return "blobs/sha256/" + digest.split(":", 1)[1]


def _pick_manifest(index: dict, ref: str, where: str, blobs) -> dict:
    """The manifest descriptor in an OCI index matching `ref` (following nested indexes)."""
    manifests = index.get("manifests") or []
    if ref.startswith("sha256:"):
        chosen = [m for m in manifests if m.get("digest") == ref]
    elif ref:
        names = lambda m: (m.get("annotations") or {}).get(_REF_NAME, "")  # noqa: E731
        chosen = [m for m in manifests if ref in (names(m), names(m).rpartition(":")[2])]
        chosen = chosen or [m for m in manifests if ref in (m.get("annotations") or {}).values()]
    else:
        chosen = manifests if len(manifests) == 1 else []
    if len(chosen) != 1:
        tags = [(m.get("annotations") or {}).get(_REF_NAME, m.get("digest")) for m in manifests]
        raise ImageError(
            f"{where}: reference {ref or '(none)'!r} matches {len(chosen)} of the images "
            f"there {tags}; name one as PATH:TAG or PATH@sha256:DIGEST"
        )
    desc = chosen[0]
    if desc.get("mediaType") in (OCI_INDEX, DOCKER_LIST):
        nested = _read_json(blobs, _blob_path(desc["digest"]), desc["digest"])
        platform = [
            m
            for m in nested.get("manifests") or []
            if all((m.get("platform") or {}).get(k) == v for k, v in _PLATFORM.items())
        ]
        if not platform:
            raise ImageError(f"{where}: no linux/amd64 image in the nested index {desc['digest']}")
        return platform[0]
    return desc


def _open_oci(path: str, ref: str, blobs) -> ImageSource:
    if not blobs.exists("index.json"):
        raise ImageError(f"{path}: not an OCI image layout (no index.json)")
    desc = _pick_manifest(_read_json(blobs, "index.json"), ref, path, blobs)
    manifest = _read_json(blobs, _blob_path(desc["digest"]), desc["digest"])
    config_digest = manifest.get("config", {}).get("digest", "")
    config = _read_json(blobs, _blob_path(config_digest), config_digest)
    layer_descs = manifest.get("layers") or []
    rels = [_blob_path(d.get("digest")) for d in layer_descs]
    diff_ids = _diff_ids(config, rels, path, blobs)
    layers = []
    for d, diff_id in zip(layer_descs, diff_ids, strict=True):
        rel = _blob_path(d.get("digest"))
        _blob_path(diff_id)
        layers.append(Layer(diff_id, d["digest"], blobs.size(rel), lambda r=rel: blobs.open(r)))
    return _source(path, ref, "oci", layers, config, config_digest)


def _open_docker_archive(path: str, ref: str, blobs) -> ImageSource:
    entries = _read_json(blobs, "manifest.json")
    if not isinstance(entries, list) or not entries:
        raise ImageError(f"{path}: manifest.json is not a non-empty list")
    if ref:
        chosen = [
            e for e in entries for t in e.get("RepoTags") or [] if ref in (t, t.rpartition(":")[2])
        ]
    else:
        chosen = entries if len(entries) == 1 else []
    if len(chosen) != 1:
        tags = [t for e in entries for t in e.get("RepoTags") or []]
        raise ImageError(f"{path}: reference {ref or '(none)'!r} matches {len(chosen)} of {tags}")
    entry = chosen[0]
    config_rel = entry["Config"]
    hexname = os.path.basename(config_rel).removesuffix(".json")
    config_digest = "sha256:" + hexname if re.fullmatch(r"[0-9a-f]{64}", hexname) else ""
    config = _read_json(blobs, config_rel, config_digest)
    diff_ids = _diff_ids(config, entry.get("Layers") or [], path, blobs)
    layers = []
    for rel, diff_id in zip(entry["Layers"], diff_ids, strict=True):
        _blob_path(diff_id)
        # Newer docker names layers blobs/sha256/<digest of the stored blob>.
        m = re.fullmatch(r"blobs/sha256/([0-9a-f]{64})", os.path.normpath(rel))
        digest = "sha256:" + m.group(1) if m else ""
        layers.append(Layer(diff_id, digest, blobs.size(rel), lambda r=rel: blobs.open(r)))
    return _source(path, ref, "docker-archive", layers, config, config_digest)


_computed_diff_ids: dict[tuple, str] = {}


def _diff_ids(config: dict, rels: list[str], path: str, blobs) -> list[str]:
    """The config's rootfs.diff_ids, checked against the layer count. A config that names
    none (hand-written images) gets them computed from the layers, once per process."""
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if diff_ids or not rels:
        if len(diff_ids) != len(rels):
            raise ImageError(f"{path}: {len(rels)} layers but {len(diff_ids)} diff_ids")
        return diff_ids
    st = os.stat(path)
    out = []
    for rel in rels:
        key = (os.path.abspath(path), rel, st.st_mtime_ns, st.st_size)
        if key not in _computed_diff_ids:
            # The digest of what the layer holds, so no check can fail against it.
            probe = Layer("", "", 0, lambda r=rel: blobs.open(r))
            _computed_diff_ids[key] = LayerReader(probe, f"{path} layer {rel}").content_digest()
        out.append(_computed_diff_ids[key])
    return out


def _source(path, ref, fmt, layers, config: dict, config_digest: str) -> ImageSource:
    cfg = config.get("config") or {}
    env = {}
    for item in cfg.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep:
            env[key] = value
    return ImageSource(
        path=os.path.abspath(path),
        ref=ref,
        format=fmt,
        layers=tuple(layers),
        env=env,
        working_dir=str(cfg.get("WorkingDir") or ""),
        config_digest=config_digest,
    )
