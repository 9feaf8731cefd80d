"""Applying layers: OCI whiteout semantics, and hostile entries refused without escaping."""

import io
import os
import stat
import tarfile

import pytest

from thundersync_jax.envs.images.layers import HostileLayerError, apply_layer


def _tar(*members) -> io.BytesIO:
    """A tar of (name, kind, payload) members: kind "f" file (payload bytes), "d" dir,
    "l" symlink / "h" hard link (payload the target), "c" char device; an optional
    fourth item is the mode."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload, *mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode[0] if mode else (0o755 if kind == "d" else 0o644)
            data = None
            if kind == "f":
                info.size, data = len(payload), io.BytesIO(payload)
            elif kind == "d":
                info.type = tarfile.DIRTYPE
            elif kind in "lh":
                info.type = tarfile.SYMTYPE if kind == "l" else tarfile.LNKTYPE
                info.linkname = payload
            elif kind == "c":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info, data)
    buf.seek(0)
    return buf


@pytest.fixture
def rootfs(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    return root


def _tree(root) -> dict[str, str]:
    """{relative path: file content, "->target" for a symlink, "/" for a directory}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = "->" + os.readlink(full)
            elif os.path.isdir(full):
                out[rel] = "/"
            else:
                out[rel] = open(full).read()
    return out


def test_whiteouts_and_opaque_directories(rootfs):
    apply_layer(
        _tar(
            ("etc", "d", None),
            ("etc/keep", "f", b"k"),
            ("etc/gone", "f", b"g"),
            ("var/cache/a", "f", b"a"),
            ("var/cache/sub/b", "f", b"b"),
            ("opt/tree/x/y", "f", b"y"),
        ),
        str(rootfs),
    )
    apply_layer(
        _tar(
            ("etc/.wh.gone", "f", b""),
            ("opt/.wh.tree", "f", b""),  # a whiteout removes a whole directory
            ("var/cache/.wh..wh..opq", "f", b""),
            ("var/cache/fresh", "f", b"new"),
            ("etc/again", "f", b"1"),
            ("etc/.wh.again", "f", b""),  # a whiteout only hides lower layers' entries
        ),
        str(rootfs),
    )
    assert _tree(rootfs) == {
        "etc": "/",
        "etc/keep": "k",
        "etc/again": "1",
        "opt": "/",
        "var": "/",
        "var/cache": "/",
        "var/cache/fresh": "new",
    }


def test_upper_layer_replaces_types_and_modes(rootfs):
    apply_layer(_tar(("a", "d", None), ("a/x", "f", b"x"), ("b", "f", b"file")), str(rootfs))
    apply_layer(
        _tar(("a", "f", b"now a file", 0o600), ("b", "d", None, 0o700), ("c", "l", "b")),
        str(rootfs),
    )
    assert _tree(rootfs) == {"a": "now a file", "b": "/", "c": "->b"}
    # What the image's root may read or traverse, the unprivileged box user may too.
    assert stat.S_IMODE(os.stat(rootfs / "a").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(rootfs / "b").st_mode) == 0o755
    apply_layer(_tar(("d", "d", None, 0o300), ("e", "f", b"", 0o200)), str(rootfs))
    assert stat.S_IMODE(os.stat(rootfs / "d").st_mode) == 0o311  # write-only stays so
    assert stat.S_IMODE(os.stat(rootfs / "e").st_mode) == 0o200


def test_symlinks_stay_inside_the_rootfs(tmp_path, rootfs):
    # Relative links are followed inside the rootfs; absolute ones are kept as links (in
    # the box / is the rootfs) but nothing may be written through them.
    apply_layer(
        _tar(
            ("etc", "d", None),
            ("up", "l", "usr/../etc"),
            ("up/more", "f", b"m"),
            ("alt", "l", "/etc/more"),
        ),
        str(rootfs),
    )
    assert (rootfs / "etc" / "more").read_text() == "m"
    assert os.readlink(rootfs / "alt") == "/etc/more"
    host_dir = tmp_path / "hostdir"
    host_dir.mkdir()
    for target in ("/", str(host_dir), "/etc"):
        with pytest.raises(HostileLayerError, match="absolute symlink"):
            apply_layer(_tar(("esc", "l", target), ("esc/pwned", "f", b"x")), str(rootfs))
    assert list(host_dir.iterdir()) == [] and not os.path.exists("/pwned")


@pytest.mark.parametrize(
    "members, match",
    [
        ([("/etc/passwd", "f", b"x")], "absolute member path"),
        ([("a/../../escape", "f", b"x")], "climbs out"),
        ([("../escape", "f", b"x")], "climbs out"),
        ([("d", "d", None), ("d/link", "l", "../../../../outside")], "points outside"),
        ([("link", "l", "..")], "points outside"),
        ([("esc", "l", "/"), ("esc/tmp/x", "f", b"x")], "absolute symlink"),
        ([("a", "d", None), ("a/b", "l", "../.."), ("a/b/x", "f", b"x")], "points outside"),
        ([("dev/null", "c", None)], "device node"),
        ([("bin/su", "f", b"x", 0o4755)], "setuid"),
        ([("bin/wall", "f", b"x", 0o2755)], "setuid"),
        ([("hard", "h", "../outside")], "climbs out"),
        ([("hard", "h", "/etc/shadow")], "absolute member path"),
        ([("x", "f", b"x"), ("x/y", "f", b"y")], "non-directory"),
    ],
)
def test_hostile_layers_are_refused(tmp_path, rootfs, members, match):
    outside = tmp_path / "outside"
    outside.write_text("host file")
    with pytest.raises(HostileLayerError, match=match):
        apply_layer(_tar(*members), str(rootfs), "layer 0")
    assert outside.read_text() == "host file"
    assert sorted(os.listdir(tmp_path)) == ["outside", "rootfs"]


def test_setuid_bits_can_be_stripped(rootfs):
    apply_layer(_tar(("bin/su", "f", b"x", 0o4755)), str(rootfs), setuid="strip")
    assert stat.S_IMODE(os.stat(rootfs / "bin" / "su").st_mode) == 0o755


def test_hard_links_share_the_inode(rootfs):
    apply_layer(_tar(("a/file", "f", b"data"), ("b", "h", "a/file")), str(rootfs))
    assert os.stat(rootfs / "b").st_ino == os.stat(rootfs / "a" / "file").st_ino
    with pytest.raises(HostileLayerError, match="no such file"):
        apply_layer(_tar(("c", "h", "a/missing")), str(rootfs))
