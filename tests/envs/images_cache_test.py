"""Reading image formats and the rootfs cache: references, digests, concurrency, LRU."""

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import tarfile

import pytest

from thundersync_jax.envs.images import build, layout
from thundersync_jax.envs.images.cache import ImageCache, chain_key
from thundersync_jax.envs.images.layers import HostileLayerError


def _layers(tmp_path, *contents):
    """One layer per dict {path: bytes}; b"" under a ".wh." name is a whiteout."""
    return [
        build.write_layer(
            [build.file_bytes(p, data) for p, data in files.items()], str(tmp_path / "work")
        )
        for files in contents
    ]


def _oci(tmp_path, name, layers, tag="t:1", env=None):
    config = build.image_config(layers, env or {"PATH": "/usr/bin", "A": "1"}, "/testbed")
    return build.write_oci_layout(str(tmp_path / name), layers, config, tag)


def _files(rootfs):
    out = {}
    for dirpath, _, filenames in os.walk(rootfs):
        for n in filenames:
            full = os.path.join(dirpath, n)
            out[os.path.relpath(full, rootfs)] = open(full, "rb").read()
    return out


def test_both_formats_read_the_same_image(tmp_path):
    layers = _layers(tmp_path, {"a/x": b"1", "a/y": b"2"}, {"a/.wh.y": b"", "b": b"3"})
    oci = _oci(tmp_path, "img.oci", layers, tag="repo/name:v1")
    config = build.image_config(layers, {"PATH": "/usr/bin", "A": "1"}, "/testbed")
    tar = build.write_docker_archive(str(tmp_path / "img.tar"), layers, config, "repo/name:v1")
    for image in [oci, oci + ":repo/name:v1", oci + ":v1", tar, tar + ":v1"]:
        src = layout.open_image(image)
        assert src.diff_ids == tuple(layer.diff_id for layer in layers), image
        assert src.env == {"PATH": "/usr/bin", "A": "1"} and src.working_dir == "/testbed"
    assert layout.open_image(oci).format == "oci"
    assert layout.open_image(tar).format == "docker-archive"
    manifest = json.load(open(os.path.join(oci, "index.json")))["manifests"][0]["digest"]
    assert layout.open_image(f"{oci}@{manifest}").layers[0].digest == layers[0].digest
    with pytest.raises(layout.ImageError, match="matches 0 of the images"):
        layout.open_image(oci + ":nope")
    with pytest.raises(layout.ImageError, match="not found"):
        layout.open_image(str(tmp_path / "absent"))
    # A hand-written config without rootfs.diff_ids: they are computed from the layers.
    del config["rootfs"]
    bare = build.write_docker_archive(str(tmp_path / "bare.tar"), layers, config, "bare:1")
    cache = ImageCache(str(tmp_path / "cache"))
    a, b, c = cache.unpack(oci), cache.unpack(tar), cache.unpack(bare)
    assert a.unpacked_now and not b.unpacked_now and a.rootfs == b.rootfs  # same layers
    assert not c.unpacked_now and c.rootfs == a.rootfs
    assert _files(a.rootfs) == {"a/x": b"1", "b": b"3"}


def _corrupt_oci_blob(oci, digest):
    path = os.path.join(oci, "blobs", "sha256", digest.split(":")[1])
    data = bytearray(open(path, "rb").read())
    data[-9] ^= 0xFF  # inside the gzip trailer's CRC: still a readable stream to a point
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(bytes(data))


def test_digest_mismatch_is_refused_and_leaves_nothing(tmp_path):
    layers = _layers(tmp_path, {"x": b"1" * 1000})
    oci = _oci(tmp_path, "img.oci", layers)
    os.unlink(os.path.join(oci, "blobs", "sha256", layers[0].digest.split(":")[1]))
    # Same size, other content: a blob whose bytes do not hash to its name.
    other = _layers(tmp_path, {"x": b"2" * 1000})[0]
    with (
        open(other.gz_path, "rb") as f,
        open(os.path.join(oci, "blobs", "sha256", layers[0].digest.split(":")[1]), "wb") as out,
    ):
        out.write(f.read())
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(layout.ImageError, match="digest"):
        cache.unpack(oci)
    assert os.listdir(cache.root + "/entries") == [] and os.listdir(cache.root + "/tmp") == []
    # A truncated blob, and one with bytes appended after the gzip stream.
    blob = os.path.join(oci, "blobs", "sha256", layers[0].digest.split(":")[1])
    good = open(layers[0].gz_path, "rb").read()
    for bad, match in [(good[: len(good) // 2], "cannot read"), (good + b"\0" * 8, "blob digest")]:
        with open(blob, "wb") as f:
            f.write(bad)
        with pytest.raises(layout.ImageError, match=match):
            cache.unpack(oci)
    assert os.listdir(cache.root + "/entries") == []
    # docker archive: a layer.tar whose content is not the config's diff_id.
    config = build.image_config(layers, {}, "")
    config["rootfs"]["diff_ids"] = ["sha256:" + hashlib.sha256(b"other").hexdigest()]
    tar = build.write_docker_archive(str(tmp_path / "bad.tar"), layers, config, "bad:1")
    with pytest.raises(layout.ImageError, match="content digest"):
        cache.unpack(tar)
    assert os.listdir(cache.root + "/entries") == []


def test_hostile_layer_in_an_image_is_refused(tmp_path):
    evil = build.symlink("etc/evil", "../../../../../root")
    layer = build.write_layer([build.directory("etc"), evil], str(tmp_path / "w"))
    oci = _oci(tmp_path, "evil.oci", [layer])
    cache = ImageCache(str(tmp_path / "cache"))
    with pytest.raises(HostileLayerError, match="points outside the rootfs"):
        cache.unpack(oci)
    assert os.listdir(cache.root + "/entries") == []


def _lease_in_process(args):
    root, image = args
    got = ImageCache(root).unpack(image)
    return got.rootfs, got.unpacked_now


def test_concurrent_unpacks_of_one_image_are_safe(tmp_path):
    files = {f"d{i}/f{j}": os.urandom(2000) for i in range(20) for j in range(20)}
    layers = _layers(tmp_path, files, {"top": b"t"})
    oci = _oci(tmp_path, "img.oci", layers)
    root = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("spawn")
    with (
        ctx.Pool(2) as procs,
        concurrent.futures.ThreadPoolExecutor(4) as threads,
    ):
        in_procs = procs.map_async(_lease_in_process, [(root, oci)] * 2)
        in_threads = list(threads.map(_lease_in_process, [(root, oci)] * 4))
        results = in_threads + in_procs.get(timeout=300)
    assert len({r for r, _ in results}) == 1
    assert sum(now for _, now in results) == 1  # unpacked exactly once
    cache = ImageCache(root)
    assert _files(results[0][0]) == {**files, "top": b"t"}
    assert os.listdir(os.path.join(root, "tmp")) == []
    keys = {e.key for e in cache.entries()}
    assert keys == {chain_key(layout.open_image(oci).diff_ids), chain_key([layers[0].diff_id])}


def test_images_sharing_lower_layers_share_files(tmp_path):
    lower = _layers(tmp_path, {"lib/big": b"x" * 5000})
    top_a, top_b = _layers(tmp_path, {"repo": b"a"}, {"repo": b"b", "lib/.wh.big": b""})
    cache = ImageCache(str(tmp_path / "cache"))
    a = cache.unpack(_oci(tmp_path, "a.oci", [*lower, top_a]))
    b = cache.unpack(_oci(tmp_path, "b.oci", [*lower, top_b]))
    c = cache.unpack(_oci(tmp_path, "c.oci", [*lower, _layers(tmp_path, {"repo": b"c"})[0]]))
    assert _files(a.rootfs) == {"lib/big": b"x" * 5000, "repo": b"a"}
    assert _files(b.rootfs) == {"repo": b"b"}  # the whiteout did not touch a's files
    ino = lambda img: os.stat(os.path.join(img.rootfs, "lib/big")).st_ino  # noqa: E731
    assert ino(a) == ino(c)  # one copy on disk


def test_lru_eviction_skips_held_entries(tmp_path):
    def image(name, size):
        return _oci(tmp_path, name, _layers(tmp_path, {name: os.urandom(size)}))

    a, b, c, d = (image(n, 40_000) for n in "abcd")
    cache = ImageCache(str(tmp_path / "cache"), max_bytes=100_000)  # room for two
    key = lambda img: chain_key(layout.open_image(img).diff_ids)  # noqa: E731
    cache.unpack(a)
    cache.unpack(b)
    os.utime(os.path.join(cache.entry_dir(key(a)), "used"), (1, 1))  # a: long unused
    cache.unpack(b)
    cache.unpack(c)  # over the limit: a goes, not b
    assert {e.key for e in cache.entries()} == {key(b), key(c)}
    with cache.lease(b):  # b is in use: d's unpack must evict c instead
        os.utime(os.path.join(cache.entry_dir(key(b)), "used"), (1, 1))
        cache.unpack(d)
    assert {e.key for e in cache.entries()} == {key(b), key(d)}
    again = cache.unpack(a)
    assert again.unpacked_now and _files(again.rootfs) == {"a": open_blob(a)}


def open_blob(oci):
    """The single file of a one-file image, read from its layer blob."""
    src = layout.open_image(oci)
    with src.layers[0].open() as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
        for member in tar:
            return tar.extractfile(member).read()
