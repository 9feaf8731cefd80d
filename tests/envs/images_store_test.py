"""The image store: images imported by the CLI, found by their tags, the index kept fresh."""

import io
import json
import os
import tarfile

import pytest

from thundersync_jax.envs.images import __main__ as images_cli
from thundersync_jax.envs.images import build, layout, store


def _images(root):
    layer = build.write_layer([build.file_bytes("etc/hi", b"hi")], str(root))
    config = build.image_config([layer], {"A": "1"})
    tar = build.write_docker_archive(str(root / "a.tar"), [layer], config, "org/a:v1")
    oci = build.write_oci_layout(str(root / "b"), [layer], config, "docker.io/org/b:latest")
    untagged = str(root / "c.tar")  # `docker save IMAGE_ID`: RepoTags null
    with tarfile.open(untagged, "w") as archive:
        data = json.dumps([{"Config": "c.json", "RepoTags": None, "Layers": []}]).encode()
        archive.addfile(build.file_bytes("manifest.json", data).info, io.BytesIO(data))
    return tar, oci, untagged, (layer, config)


@pytest.mark.parametrize(
    "name, want",
    [("org/a", "org/a:latest"), ("docker.io/library/ubuntu", "ubuntu:latest"),
     ("host:5000/x/y", "host:5000/x/y:latest"), ("x/y:3", "x/y:3")],
)  # fmt: skip
def test_normalize(name, want):
    assert store.normalize(name) == want


def test_import_then_list_then_resolve(tmp_path, capsys):
    tar, oci, untagged, (layer, config) = _images(tmp_path)
    root = tmp_path / "store"
    assert images_cli.main(["import", tar, oci, "--store", str(root)]) == 0
    assert images_cli.main(["list", "--store", str(root)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert "org/a:v1\ta.tar" in listed and "org/b:latest\tb" in listed
    s = store.ImageStore(str(root))
    got = s.resolve("org/a:v1")
    assert got == os.path.join(root, "a.tar") + ":org/a:v1"
    assert layout.open_image(got).env == {"A": "1"}  # the string opens as the image
    assert layout.open_image(s.resolve("docker.io/org/b")).format == "oci"
    assert s.resolve("org/a") is None  # :latest is not v1
    assert images_cli.main(["import", untagged, "--store", str(root)]) == 2
    assert "no tag" in capsys.readouterr().err
    # A file added behind the store's back is indexed on the next open.
    assert s.resolve("org/d:1") is None
    build.write_docker_archive(str(root / "d.tar"), [layer], config, "org/d:1")
    assert store.ImageStore(str(root)).resolve("org/d:1") == f"{root / 'd.tar'}:org/d:1"
    assert images_cli.main(["import", tar, "--store", str(root)]) == 2  # a.tar exists
