"""Where a SWE instance runs: the host's toolchain, or its container image.

An instance with `image` runs every agent command and every test inside that image
(unpacked once into the rootfs cache, held for as long as the episode or the
verification uses it): the rootfs read-only as `/`, the episode's workspace at
`instance.repo_dir`, the image's Env under the instance's env. An image that ships
the repository (a git repository at repo_dir, as SWE-bench images do) is the source
of the workspace's checkout when the instance names no `repo_path`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from thundersync_jax.envs.images import cache as cache_lib
from thundersync_jax.envs.swe.instance import SweInstance

# Image Env entries the sandbox decides itself (the box user is not the image's root).
_SANDBOX_OWNED_ENV = ("HOME", "USER", "LOGNAME", "HOSTNAME")


@contextlib.contextmanager
def held_image(
    instance: SweInstance, image_cache: cache_lib.ImageCache | None = None
) -> Iterator[cache_lib.UnpackedImage | None]:
    """The instance's unpacked image, held until the block ends (None without an image)."""
    if not instance.image:
        yield None
        return
    cache = image_cache if image_cache is not None else cache_lib.default_cache()
    with cache.lease(instance.image) as unpacked:
        yield unpacked


def sandbox_config(
    instance: SweInstance,
    config: Mapping[str, Any],
    image: cache_lib.UnpackedImage | None,
) -> dict[str, Any]:
    """Sandbox keyword arguments for the instance: `config` with the instance's env (and,
    with an image, the image's rootfs, Env, repository path and working directory)."""
    out = dict(config)
    env = {**instance.env, **config.get("env", {})}
    if image is not None:
        image_env = {k: v for k, v in image.env.items() if k not in _SANDBOX_OWNED_ENV}
        env = {**image_env, **env}
        out.update(rootfs=image.rootfs, root_at=instance.repo_dir, cwd=box_cwd(instance, image))
    out["env"] = env
    return out


def box_cwd(instance: SweInstance, image: cache_lib.UnpackedImage) -> str:
    """The image's WorkingDir when it lies in the repository, else the repository: test
    ids are relative to where the tests run, and a WorkingDir such as / would break them."""
    wd = os.path.normpath(image.working_dir) if image.working_dir else ""
    repo_dir = instance.repo_dir
    return wd if wd and (wd == repo_dir or wd.startswith(repo_dir + "/")) else repo_dir


def repository_in_image(instance: SweInstance, image: cache_lib.UnpackedImage | None) -> str | None:
    """The git repository the image keeps at repo_dir (host path), if any."""
    tree = tree_in_image(instance, image)
    return tree if tree is not None and os.path.isdir(os.path.join(tree, ".git")) else None


def tree_in_image(instance: SweInstance, image: cache_lib.UnpackedImage | None) -> str | None:
    """The directory the image has at repo_dir (host path), if any."""
    if image is None:
        return None
    path = os.path.join(image.rootfs, instance.repo_dir.lstrip("/"))
    real = os.path.realpath(path)  # a symlink in the image must not lead the host elsewhere
    inside = real.startswith(os.path.realpath(image.rootfs) + os.sep)
    return real if inside and os.path.isdir(real) else None
