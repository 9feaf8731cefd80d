"""Container images for SWE instances, rootless: read, unpack once, run under bubblewrap.

    from thundersync_jax.envs import images
    cache = images.ImageCache("/scratch/rootfs", max_bytes=100 << 30)
    with cache.lease("swe/astropy.oci:latest") as img:   # unpacked once, held meanwhile
        with Sandbox(workspace, rootfs=img.rootfs, root_at="/testbed", env=img.env) as sb:
            sb.run("python -m pytest -q tests/test_x.py")

Modules: `layout` (OCI layouts and `docker save` tarballs: manifests, configs, digests),
`layers` (one layer applied safely: whiteouts, opaque directories, hostile entries
refused), `cache` (the content-addressed rootfs cache: locks, atomic renames, shared
lower layers, LRU eviction), `store` (a directory of images found by tag), `build`
(writing layers, OCI layouts, docker archives), `python_image` (small images from the
host's interpreter); `python -m thundersync_jax.envs.images build|inspect|import|list` is
the command line. How a SWE instance uses
its image: thundersync_jax.envs.swe.image_sandbox. Nothing is pulled from a registry.
"""

from thundersync_jax.envs.images.cache import (
    CacheEntry,
    ImageCache,
    UnpackedImage,
    chain_key,
    default_cache,
)
from thundersync_jax.envs.images.layers import HostileLayerError, apply_layer
from thundersync_jax.envs.images.layout import ImageError, ImageSource, open_image
from thundersync_jax.envs.images.store import ImageStore, import_image, swebench_image_name

__all__ = [
    "CacheEntry",
    "HostileLayerError",
    "ImageCache",
    "ImageError",
    "ImageSource",
    "ImageStore",
    "UnpackedImage",
    "apply_layer",
    "chain_key",
    "default_cache",
    "import_image",
    "open_image",
    "swebench_image_name",
]
