"""Images built once per test session and shared by the sandbox and image tests.

Not a test module: test files load it by path (pytest runs with --import-mode=importlib,
so test directories are not importable packages) under the name NAME in sys.modules,
so the session builds the interpreter layers only once (10-20 s on 2 cores):

    def _image_fixtures():
        name = "tsj_images_test_fixtures"
        if name not in sys.modules:
            path = pathlib.Path(__file__).with_name("images_fixtures.py")
            spec = importlib.util.spec_from_file_location(name, path)
            sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[name])
        return sys.modules[name]
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from thundersync_jax.envs.images import build, python_image
from thundersync_jax.envs.images import cache as cache_lib

NAME = "tsj_images_test_fixtures"
_memo: dict[str, object] = {}


def scratch() -> str:
    """A session-wide scratch directory, removed at exit."""
    if "scratch" not in _memo:
        path = tempfile.mkdtemp(prefix="tsj-image-tests-")
        atexit.register(shutil.rmtree, path, True)
        _memo["scratch"] = path
    return _memo["scratch"]


def base_layers() -> tuple[list[build.LayerBlob], dict[str, str]]:
    """The system, python and packages layers of this interpreter, and the image Env."""
    if "base" not in _memo:
        _memo["base"] = python_image.base_layers(os.path.join(scratch(), "layers"))
    return _memo["base"]


def python_oci() -> str:
    """An OCI layout of just the base layers (an interpreter with pytest)."""
    if "oci" not in _memo:
        layers, env = base_layers()
        out = os.path.join(scratch(), "python.oci")
        build.write_oci_layout(out, layers, build.image_config(layers, env), "python:test")
        _memo["oci"] = out
    return _memo["oci"]


def cache() -> cache_lib.ImageCache:
    """The session's rootfs cache (no size limit)."""
    if "cache" not in _memo:
        _memo["cache"] = cache_lib.ImageCache(os.path.join(scratch(), "cache"))
    return _memo["cache"]
