"""What the box sees: bubblewrap mount arguments for the host toolchain or an image rootfs.

Host mode binds the host's /usr (and /bin, /lib* as on the host), a short list of /etc
files and the interpreter's prefixes read-only. Image mode shows an unpacked image
rootfs as `/` (read-only, entry by entry, so the sandbox's own mounts need no mount
point inside the image) plus the host's loader, bash, setpriv and prlimit under a
private directory: the box can then be entered, limited and have its uid dropped even
when the image holds nothing but an interpreter.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

# /etc entries a shell, coreutils and Python need; secrets (shadow, ssh, sudoers,
# gitconfig/npmrc/pip.conf that may hold tokens) are deliberately absent.
ETC_ENTRIES = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "gai.conf",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "protocols",
    "resolv.conf",
    "services",
    "ssl",
)
SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root"]
    + ["/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var"]
)
ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_TOOLS_DIR = "/.tsj-host"  # where image mode shows the host's tools inside the box
# Image paths the sandbox replaces with its own mounts (or leaves out, like /sys).
_IMAGE_SKIPPED = frozenset(["/proc", "/dev", "/tmp", "/sys", HOST_TOOLS_DIR])


def host_system_mounts() -> list[str]:
    """The host's /usr, root symlinks and allowed /etc entries, read-only."""
    a = ["--ro-bind", "/usr", "/usr"]
    for link in ROOT_LINKS:
        if os.path.islink(link):
            a += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            a += ["--ro-bind", link, link]
    # bwrap would create missing mount points' parents 0700 (untraversable by the box
    # user); explicit --dir makes them 0755.
    a += ["--dir", "/etc"]
    for name in ETC_ENTRIES:
        a += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return a


def image_rootfs_mounts(rootfs: str, own_mounts: list[str]) -> list[str]:
    """`rootfs` shown as the box's `/`, read-only, around the sandbox's `own_mounts`.

    bwrap cannot create a mount point inside a read-only bind, so the rootfs is bound
    entry by entry: an image directory that is (or contains) one of `own_mounts` becomes
    a fresh directory whose entries are bound one level further down. Symlinks are
    recreated as they are (an absolute target then resolves inside the box).

    Args:
      rootfs: host directory of an unpacked image.
      own_mounts: absolute box paths the caller mounts itself (the repository, the
        passwd and group files); the image's entries there are not bound.
    """
    own = {os.path.normpath(p) for p in own_mounts}
    expand = {parent for p in own for parent in ancestors(p)}
    args: list[str] = []
    made: set[str] = set()

    def walk(host_dir: str, box_dir: str) -> None:
        for name in sorted(os.listdir(host_dir)):
            host, box = os.path.join(host_dir, name), os.path.join(box_dir, name)
            if box in own or box in _IMAGE_SKIPPED:
                continue
            if os.path.islink(host):
                if box in expand:
                    raise ValueError(
                        f"image path {box!r} is a symlink; the sandbox mounts "
                        f"{sorted(p for p in own if is_under(p, box))} under it"
                    )
                args.extend(["--symlink", os.readlink(host), box])
            elif os.path.isdir(host) and box in expand:
                mode = os.stat(host).st_mode & 0o777
                args.extend(["--perms", f"{mode:04o}", "--dir", box])
                made.add(box)
                walk(host, box)
            elif os.path.isdir(host) or os.path.isfile(host):
                args.extend(["--ro-bind", host, box])
            # sockets and fifos of the image are left out

    walk(rootfs, "/")
    for parent in sorted(expand - made, key=len):  # not in the image: bwrap would make it 0700
        args.extend(["--dir", parent])
    return args


@functools.cache
def host_tools() -> tuple[list[str], dict[str, str]]:
    """(bwrap arguments binding the host's loader and libraries under HOST_TOOLS_DIR,
    {tool: argv prefix that runs the host's copy of bash, setpriv or prlimit in the box}).

    Each tool runs through the host's dynamic loader with an explicit library path, so
    neither the image's loader nor its libc (nor their absence) matters.
    """
    tools = {t: shutil.which(t, path=SYSTEM_PATH) for t in ("bash", "setpriv", "prlimit")}
    missing = [t for t, p in tools.items() if p is None]
    if missing:
        raise FileNotFoundError(f"host tool(s) {missing} not found on {SYSTEM_PATH}")
    loader, lib_dirs = None, []
    for path in tools.values():
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            parts = line.split()
            lib = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0]
            if not lib.startswith("/"):
                continue
            if "ld-linux" in os.path.basename(lib) or "ld64" in os.path.basename(lib):
                loader = os.path.realpath(lib)
            else:
                lib_dirs.append(os.path.dirname(os.path.realpath(lib)))
    if loader is None:
        raise FileNotFoundError(f"no dynamic loader in `ldd {tools['bash']}`")
    files = [loader, *(os.path.realpath(p) for p in tools.values())]
    dirs = sorted({os.path.dirname(f) for f in files} | set(lib_dirs), key=len)
    binds = []
    for d in dirs:
        if not any(is_under(d, kept) for kept in binds):
            binds.append(d)
    args, made = [], set()
    for d in binds:
        for parent in [HOST_TOOLS_DIR, *ancestors(HOST_TOOLS_DIR + d)]:
            if parent not in made:  # bwrap would make missing parents 0700
                args += ["--dir", parent]
                made.add(parent)
        args += ["--ro-bind", d, HOST_TOOLS_DIR + d]
    library_path = ":".join(HOST_TOOLS_DIR + d for d in dict.fromkeys(lib_dirs))
    prefix = [HOST_TOOLS_DIR + loader, "--library-path", library_path]
    argv = {t: [*prefix, HOST_TOOLS_DIR + os.path.realpath(p)] for t, p in tools.items()}
    return args, argv


def image_has_utf8_locale(rootfs: str) -> bool:
    locale = os.path.join(rootfs, "usr", "lib", "locale")
    return any(os.path.isdir(os.path.join(locale, n)) for n in ("C.utf8", "C.UTF-8"))


def python_binds(executable: str = sys.executable) -> tuple[str, ...]:
    """Host directories an interpreter needs, to bind read-only into the box.

    For a virtual environment this is the environment and the base installation it
    points to (e.g. /work/main/.venv and /root/.pyenv/versions/3.11.7), never their
    parents: /root stays hidden. Directories under /usr are left out (always bound).

    Args:
      executable: path of a python interpreter on the host.

    Returns:
      Absolute directories, outermost first, none nested in another.
    """
    exe = os.path.abspath(executable)
    if not os.access(exe, os.X_OK):
        raise ValueError(f"python executable {executable!r} does not exist or is not executable")
    if os.path.realpath(exe) == os.path.realpath(sys.executable):
        prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        query = (
            "import sys; print(sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)"
        )
        out = subprocess.run([exe, "-I", "-c", query], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ValueError(f"could not query prefixes of {executable!r}: {out.stderr.strip()}")
        prefixes = out.stdout.split()
    real_exe = os.path.realpath(exe)
    dirs = {os.path.realpath(p) for p in prefixes} | {os.path.dirname(os.path.dirname(exe))}
    if not any(is_under(real_exe, d) for d in dirs | {"/usr"}):
        dirs.add(os.path.dirname(real_exe))
    for d in dirs:
        if d in ("/", "/root", "/home", "/etc", "/proc", "/sys", "/dev"):
            raise ValueError(
                f"python {executable!r} lives in {d!r}; binding that would expose the host. "
                "Use an interpreter installed in its own prefix (venv, pyenv, conda, /usr)."
            )
    kept = []
    for d in sorted(dirs, key=len):
        if not is_under(d, "/usr") and not any(is_under(d, k) for k in kept):
            kept.append(d)
    return tuple(kept)


def ancestors(path: str) -> list[str]:
    """Proper ancestors of an absolute path but `/`, outermost first.

    "/a/b/c" -> ["/a", "/a/b"].
    """
    parts = os.path.normpath(path).strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def image_rootfs_dir(rootfs: str | os.PathLike | None) -> str | None:
    if rootfs is None:
        return None
    path = os.path.abspath(os.fspath(rootfs))
    if not os.path.isdir(path) or path == "/":
        raise ValueError(f"rootfs {path!r} is not an unpacked image directory")
    return path


def box_dirs(root_at: str, cwd: str | None) -> tuple[str, str]:
    """(where the task directory appears, the working directory), both checked."""
    root_at = os.path.normpath(root_at) if isinstance(root_at, str) else root_at
    if not isinstance(root_at, str) or not os.path.isabs(root_at) or root_at == "/":
        raise ValueError(f"root_at must be an absolute box path other than '/', got {root_at!r}")
    reserved = ("/proc", "/dev", "/tmp", "/sys", "/etc", "/usr", HOST_TOOLS_DIR)
    if any(is_under(root_at, r) or is_under(r, root_at) for r in reserved):
        raise ValueError(f"root_at {root_at!r} overlaps a directory the sandbox mounts itself")
    cwd = root_at if cwd is None else os.path.normpath(cwd)
    if not os.path.isabs(cwd):
        raise ValueError(f"cwd must be an absolute box path, got {cwd!r}")
    return root_at, cwd
