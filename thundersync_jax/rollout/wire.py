"""Message encoding for the engine transport: msgpack, with numpy arrays as bytes + dtype + shape.

Nothing here executes code from the peer (no pickle): a malformed frame raises `WireError`, which
the server turns into an error reply instead of dying.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

_ARRAY_TAG = "__ndarray__"


class WireError(ValueError):
    """A frame that is not a valid engine message."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        shape = list(arr.shape)
        return {_ARRAY_TAG: True, "dtype": arr.dtype.str, "shape": shape, "data": arr.data}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} on the engine wire: {obj!r}")


def _object_hook(obj: dict) -> Any:
    if obj.get(_ARRAY_TAG) is True:
        dtype = np.dtype(obj["dtype"])
        if dtype.hasobject:
            raise WireError(f"object arrays are not allowed on the wire (dtype {dtype})")
        return np.frombuffer(obj["data"], dtype=dtype).reshape(obj["shape"])
    return obj


def encode(message: dict) -> bytes:
    """Serializes one message (a dict of plain values and numpy arrays) to bytes."""
    return msgpack.packb(message, default=_default, use_bin_type=True)


def decode(frame: bytes) -> dict:
    """Parses one frame produced by `encode`; raises WireError on anything else."""
    try:
        message = msgpack.unpackb(frame, object_hook=_object_hook, raw=False, strict_map_key=True)
    except WireError:
        raise
    except Exception as e:  # msgpack raises several unrelated types for garbage input
        raise WireError(f"undecodable frame ({len(frame)} bytes): {type(e).__name__}: {e}") from e
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise WireError(f"a message must be a map with a string 'op' field, got {type(message)}")
    return message
