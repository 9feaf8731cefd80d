"""Writing images: layer tars, OCI image layouts and `docker save` tarballs.

    entries = [build.host_file("/usr/bin/bash", "usr/bin/bash"), build.whiteout("etc/motd")]
    layer = build.write_layer(entries, work_dir)
    build.write_oci_layout(out_dir, [layer], build.image_config([layer], env={...}), "x:1")
    build.write_docker_archive(out_tar, [layer], config, "x:1")

A layer is written once as an uncompressed tar (its sha256 is the diff_id) and once
gzipped (its sha256 is the OCI blob digest); the OCI layout stores the gzipped blob,
the docker archive the plain tar, as `docker save` does. Entries are owned by root
with host modes and mtimes, setuid/setgid bits cleared; gzip headers carry no time,
so the same files give the same digests on every build.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Sequence

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tar member: its header and, for a regular file, where its bytes come from."""

    info: tarfile.TarInfo
    data: bytes | None = None
    source: str | None = None  # host file to copy


@dataclasses.dataclass(frozen=True)
class LayerBlob:
    """A written layer.

    Attributes:
      tar_path: the uncompressed tar; diff_id is its sha256.
      gz_path: the gzipped tar; digest is its sha256, gz_size its size.
    """

    tar_path: str
    gz_path: str
    diff_id: str
    digest: str
    gz_size: int


def _info(arcname: str, kind: bytes, mode: int, mtime: float = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arcname.strip("/"))
    info.type, info.mode, info.mtime = kind, mode & 0o1777, int(mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def directory(arcname: str, mode: int = 0o755) -> Entry:
    return Entry(_info(arcname, tarfile.DIRTYPE, mode))


def symlink(arcname: str, target: str) -> Entry:
    info = _info(arcname, tarfile.SYMTYPE, 0o777)
    info.linkname = target
    return Entry(info)


def file_bytes(arcname: str, data: bytes, mode: int = 0o644) -> Entry:
    info = _info(arcname, tarfile.REGTYPE, mode)
    info.size = len(data)
    return Entry(info, data=data)


def whiteout(arcname: str) -> Entry:
    """Deletes `arcname` of lower layers."""
    head, name = os.path.split(arcname.strip("/"))
    return file_bytes(os.path.join(head, ".wh." + name), b"")


def opaque(dir_arcname: str) -> Entry:
    """Hides everything lower layers put in `dir_arcname`."""
    return file_bytes(os.path.join(dir_arcname.strip("/"), ".wh..wh..opq"), b"")


def host_file(path: str, arcname: str) -> Entry:
    """A host file, directory or symlink (not followed) as a member named `arcname`."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        entry = symlink(arcname, os.readlink(path))
    elif stat.S_ISDIR(st.st_mode):
        entry = directory(arcname, st.st_mode)
    elif stat.S_ISREG(st.st_mode):
        info = _info(arcname, tarfile.REGTYPE, st.st_mode)
        info.size = st.st_size
        entry = Entry(info, source=path)
    else:
        raise ValueError(f"{path!r}: only files, directories and symlinks go into a layer")
    entry.info.mtime = int(st.st_mtime)
    return entry


def write_layer(entries: Iterable[Entry], work_dir: str) -> LayerBlob:
    """Writes the entries (in order; parents before children) as a layer under work_dir."""
    os.makedirs(work_dir, exist_ok=True)
    fd, tar_path = tempfile.mkstemp(suffix=".tar", dir=work_dir)
    with (
        os.fdopen(fd, "wb") as raw,
        tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for entry in entries:
            if entry.source is not None:
                with open(entry.source, "rb") as f:
                    tar.addfile(entry.info, f)
            else:
                tar.addfile(entry.info, io.BytesIO(entry.data) if entry.data is not None else None)
    diff = hashlib.sha256()
    gz_path = tar_path[: -len(".tar")] + ".tar.gz"
    with open(tar_path, "rb") as src, open(gz_path, "wb") as dst:
        with gzip.GzipFile(fileobj=dst, mode="wb", compresslevel=1, mtime=0) as gz:
            while chunk := src.read(1 << 20):
                diff.update(chunk)
                gz.write(chunk)
    digest = _file_digest(gz_path)
    return LayerBlob(
        tar_path, gz_path, "sha256:" + diff.hexdigest(), digest, os.path.getsize(gz_path)
    )


def image_config(
    layers: Sequence[LayerBlob], env: dict[str, str] | None = None, working_dir: str = ""
) -> dict:
    """An OCI/docker image config for linux/amd64 with these layers, Env and WorkingDir."""
    cfg: dict = {"Env": [f"{k}={v}" for k, v in (env or {}).items()]}
    if working_dir:
        cfg["WorkingDir"] = working_dir
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created_by": "thundersync_jax.envs.images"} for _ in layers],
    }


def write_oci_layout(out_dir: str, layers: Sequence[LayerBlob], config: dict, tag: str) -> str:
    """An OCI image layout at out_dir (index.json names the image `tag`); returns out_dir."""
    blobs = os.path.join(out_dir, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    for layer in layers:
        _place(layer.gz_path, os.path.join(blobs, layer.digest.split(":")[1]))
    config_desc = _json_blob(blobs, config, OCI_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config_desc,
        "layers": [
            {"mediaType": OCI_LAYER_GZIP, "digest": layer.digest, "size": layer.gz_size}
            for layer in layers
        ],
    }
    manifest_desc = _json_blob(blobs, manifest, OCI_MANIFEST)
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}
    index["manifests"] = [manifest_desc]
    _write_json(os.path.join(out_dir, "index.json"), index)
    _write_json(os.path.join(out_dir, "oci-layout"), {"imageLayoutVersion": "1.0.0"})
    return out_dir


def write_docker_archive(out_tar: str, layers: Sequence[LayerBlob], config: dict, tag: str) -> str:
    """A `docker save` tarball (legacy layout: <id>/layer.tar, <config>.json,
    manifest.json, repositories) holding the image tagged `tag`; returns out_tar."""
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_names = [layer.diff_id.split(":")[1] + "/layer.tar" for layer in layers]
    name, _, version = tag.rpartition(":") if ":" in tag else (tag, "", "latest")
    manifest = [{"Config": config_name, "RepoTags": [f"{name}:{version}"], "Layers": layer_names}]
    repositories = {name: {version: layer_names[-1].split("/")[0]}}
    tmp = out_tar + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for layer, arcname in zip(layers, layer_names, strict=True):
            tar.add(layer.tar_path, arcname=arcname, recursive=False)
        for arcname, data in [
            (config_name, config_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
            ("repositories", json.dumps(repositories).encode()),
        ]:
            tar.addfile(file_bytes(arcname, data).info, io.BytesIO(data))
    os.replace(tmp, out_tar)
    return out_tar


def _json_blob(blobs: str, obj: dict, media_type: str) -> dict:
    data = json.dumps(obj, sort_keys=True).encode()
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)


def _place(src: str, dst: str) -> None:
    """Hard-links (else copies) a blob into a layout; blobs are immutable by name."""
    if os.path.exists(dst):
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
