"""Small images made from the host's interpreter, for tests and demos (no registry needed).

Layers, bottom first (the first three are identical for every repository, so their
digests and their unpacked cache entry are shared):

  system    the dynamic loader and every shared library the interpreter, its extension
            modules and a few shell tools need, at their host paths (symlink chains
            such as /lib64 -> usr/lib64 kept), plus those tools (bash, coreutils, grep,
            sed, patch, ...) so an agent's commands work inside the image
  python    the interpreter's base prefix at its host path: the binary, libpython, the
            stdlib without tests, idle, tkinter, ensurepip, lib2to3 and site-packages
  packages  `pytest` and its requirements (markers evaluated), from the interpreter's
            environment, in the base prefix's site-packages, and a `pytest` script
  repo      (per repository) a clone of the repository at /testbed, history included

Env: PATH with the prefix's bin first, LANG=C.UTF-8.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable

from thundersync_jax.envs.images import build

TOOLS = (
    "bash sh cat ls cp mv rm mkdir rmdir ln touch chmod head tail wc sort uniq cut tr "
    "grep sed find xargs env echo true false test pwd sleep basename dirname realpath id "
    "diff patch yes nohup setsid pgrep ps kill which"
).split()
_STDLIB_SKIP = {"test", "site-packages", "idlelib", "tkinter", "turtledemo", "ensurepip"}
_STDLIB_SKIP |= {"lib2to3", "pydoc_data", "__phello__"}
_QUERY = r"""
import importlib.metadata as md, json, os, sys, sysconfig
from packaging.requirements import Requirement
todo, seen, files, scripts = list(sys.argv[1:]), set(), [], []
while todo:
    name = todo.pop()
    key = name.lower().replace("_", "-")
    if key in seen:
        continue
    seen.add(key)
    dist = md.distribution(name)
    site = str(dist.locate_file(""))
    for f in dist.files or []:
        full = os.path.normpath(os.path.join(site, str(f)))
        if full.startswith(site + os.sep) and os.path.isfile(full):
            files.append([full, os.path.relpath(full, site)])
    scripts += [[e.name, e.value] for e in dist.entry_points if e.group == "console_scripts"]
    for req in dist.requires or []:
        r = Requirement(req)
        if r.marker is None or r.marker.evaluate({"extra": ""}):
            todo.append(r.name)
print(json.dumps({
    "base_prefix": sys.base_prefix, "executable": os.path.realpath(sys.executable),
    "stdlib": sysconfig.get_paths()["stdlib"], "version": "%d.%d" % sys.version_info[:2],
    "files": files, "scripts": scripts,
}))
"""


def interpreter_info(python: str, packages: Iterable[str]) -> dict:
    """Prefix, stdlib, version and the package files of `python`'s environment."""
    out = subprocess.run(
        [python, "-I", "-c", _QUERY, *packages], capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        raise RuntimeError(f"could not inspect {python!r}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def base_layers(
    work_dir: str, python: str = sys.executable, packages: Iterable[str] = ("pytest",)
) -> tuple[list[build.LayerBlob], dict[str, str]]:
    """(the system, python and packages layers, the image Env) for `python`."""
    info = interpreter_info(python, packages)
    prefix, version = info["base_prefix"], info["version"]
    python_files = _python_files(info)
    package_files = [full for full, _ in info["files"]]
    libs = _shared_libraries([info["executable"], *python_files, *package_files, *_tools()])
    system = _HostTree()
    root_links = [p for p in ("/bin", "/sbin", "/lib", "/lib64") if os.path.islink(p)]
    for path in [*root_links, *libs, *_tools(), "/etc/ld.so.cache", *_locale_files()]:
        system.add(path)
    py = _HostTree()
    for path in python_files:
        py.add(path)
    site = os.path.join(info["stdlib"], "site-packages")
    pkgs = _HostTree()
    for full, rel in info["files"]:
        pkgs.add(full, as_path=os.path.join(site, rel))
    for name, value in info["scripts"]:  # console scripts, as pip would write them
        module, _, attr = value.partition(":")
        script = f"#!{prefix}/bin/python{version}\nimport sys\nfrom {module} import {attr}\n"
        script += f"sys.exit({attr}())\n"
        pkgs.add_bytes(os.path.join(prefix, "bin", name), script.encode(), 0o755)
    layers = [build.write_layer(t.entries, work_dir) for t in (system, py, pkgs)]
    env = {"PATH": f"{prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    env["LANG"] = "C.UTF-8"
    return layers, env


def repository_layer(repo_path: str, work_dir: str, at: str = "/testbed") -> build.LayerBlob:
    """A layer holding a clone of `repo_path` (all history) at `at`."""
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        clone = os.path.join(tmp, "repo")
        subprocess.run(
            ["git", "clone", "--quiet", "--no-hardlinks", repo_path, clone],
            check=True,
            capture_output=True,
            timeout=600,
        )
        tree = _HostTree()
        for parent in build_parents(at):
            tree.entries.append(build.directory(parent))
        tree.entries.append(build.host_file(clone, at))
        for dirpath, dirnames, filenames in os.walk(clone):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                tree.entries.append(build.host_file(full, at + full[len(clone) :]))
        return build.write_layer(tree.entries, work_dir)


def build_parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class _HostTree:
    """Layer entries for host paths, with every parent directory and symlink on the way."""

    def __init__(self):
        self.entries: list[build.Entry] = []
        self._seen: set[str] = set()

    def add(self, path: str, as_path: str | None = None) -> None:
        """Adds host `path` (at `as_path` in the image, default the same path)."""
        if as_path is not None:
            self._parents(as_path)
            self._emit(path, as_path)
            return
        current = "/"
        parts = [p for p in path.split("/") if p]
        hops = 0
        while parts:
            nxt = os.path.join(current, parts.pop(0))
            if os.path.islink(nxt) and hops < 40:
                hops += 1
                self._parents(nxt)
                self._emit(nxt, nxt)
                target = os.readlink(nxt)
                resolved = os.path.normpath(os.path.join(current, target))  # abs target wins
                parts = [p for p in resolved.split("/") if p] + parts
                current = "/"
            else:
                current = nxt
        self._parents(current)
        self._emit(current, current)

    def add_bytes(self, as_path: str, data: bytes, mode: int) -> None:
        self._parents(as_path)
        self.entries.append(build.file_bytes(as_path, data, mode))

    def _parents(self, path: str) -> None:
        for parent in build_parents(path):
            if "/" + parent not in self._seen:
                self._seen.add("/" + parent)
                real = "/" + parent
                mode = os.stat(real).st_mode if os.path.isdir(real) else 0o755
                # Parents are always traversable: /root is 0700 on the host.
                self.entries.append(build.directory(parent, (mode & 0o777) | 0o755))

    def _emit(self, host: str, as_path: str) -> None:
        if as_path not in self._seen:
            self._seen.add(as_path)
            self.entries.append(build.host_file(host, as_path))


def _python_files(info: dict) -> list[str]:
    prefix, stdlib, version = info["base_prefix"], info["stdlib"], info["version"]
    files = [info["executable"]]
    bindir = os.path.join(prefix, "bin")
    for name in ("python", "python3", f"python{version}"):
        if os.path.lexists(os.path.join(bindir, name)):
            files.append(os.path.join(bindir, name))
    libdir = os.path.join(prefix, "lib")
    files += [
        os.path.join(libdir, n) for n in sorted(os.listdir(libdir)) if n.startswith("libpython")
    ]
    for dirpath, dirnames, filenames in os.walk(stdlib):
        if dirpath == stdlib:
            dirnames[:] = [
                d for d in dirnames if d not in _STDLIB_SKIP and not d.startswith("config-")
            ]
        dirnames.sort()
        for name in sorted(filenames):
            if ".opt-" not in name:
                files.append(os.path.join(dirpath, name))
    return files


def _locale_files() -> list[str]:
    """The C.UTF-8 locale (Debian keeps it on disk; bash warns without it)."""
    found = []
    for dirpath, _, filenames in os.walk("/usr/lib/locale/C.utf8"):
        found += [os.path.join(dirpath, n) for n in sorted(filenames)]
    return found


def _tools() -> list[str]:
    found = [shutil.which(t, path="/usr/bin:/bin") for t in TOOLS]
    return [p for p in found if p]


def _shared_libraries(paths: Iterable[str]) -> list[str]:
    """The loader and shared libraries (as ldd names them) of every ELF file in `paths`."""
    libs: dict[str, None] = {}
    for path in paths:
        if not (path.endswith(".so") or ".so." in path or os.access(path, os.X_OK)):
            continue
        if os.path.isdir(path) or not _is_elf(path):
            continue
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            parts = line.split()
            lib = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0] if parts else ""
            if lib.startswith("/"):
                libs[lib] = None
    return list(libs)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
