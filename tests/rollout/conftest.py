"""Fixtures of the rollout tests: a tiny Qwen3 and a real server process running it."""

import os
import subprocess
import sys
import types
import uuid

import pytest
from flax import nnx

from thundersync_jax.models import qwen3
from thundersync_jax.rollout import server as rollout_server
from thundersync_jax.rollout.client import EngineClient

# Prime-sized dims catch transposed axes; small enough that a server starts and compiles fast.
TINY = qwen3.Qwen3Config(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=44,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
ROWS = 4
MAX_SEQ_LEN = 64
INIT_SEED = 0


def _model(seed: int = INIT_SEED, sharp: bool = False) -> qwen3.Qwen3:
    """The tiny model; `sharp` scales the final norm so next-token distributions are peaked.

    A fresh init is nearly uniform over the vocabulary, so two different random models draw the
    same tokens from the same key; a peaked one makes the tokens depend on the weights.
    """
    model = qwen3.Qwen3(TINY, rngs=nnx.Rngs(seed))
    if sharp:
        model.norm.scale[...] = model.norm.scale[...] * 40.0
    return model


def _server_args(rows: int = ROWS, max_seq_len: int = MAX_SEQ_LEN) -> list[str]:
    """Command-line arguments of a rollout server running the tiny model (seed INIT_SEED)."""
    return rollout_server.server_args(
        TINY.to_hf(), init_seed=INIT_SEED, max_batch=rows, max_seq_len=max_seq_len
    )


def _server_env() -> dict[str, str]:
    # One CPU device is all an engine needs; the 8 fake devices of the test session slow it down.
    env = dict(os.environ)
    flag = "--xla_force_host_platform_device_count=8"
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(flag, "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.fixture(scope="session")
def tiny():
    """The tiny model's config, a model factory (by init seed), and server settings."""
    return types.SimpleNamespace(
        cfg=TINY,
        model=_model,
        rows=ROWS,
        max_seq_len=MAX_SEQ_LEN,
        server_args=_server_args,
        server_env=_server_env,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `python -m thundersync_jax.rollout.server` process and a connected client."""
    sock = tmp_path_factory.mktemp("sock") / f"engine-{uuid.uuid4().hex[:6]}.sock"
    address = f"ipc://{sock}"
    cmd = [sys.executable, "-m", "thundersync_jax.rollout.server", "--address", address]
    cmd += ["--parent-pid", str(os.getpid()), *_server_args()]
    proc = subprocess.Popen(cmd, env=_server_env())
    client = EngineClient(address, timeout_s=120)
    try:
        client.wait_ready(timeout_s=120)
        yield proc, client
    finally:
        try:
            client.shutdown(timeout_s=10)
            proc.wait(timeout=10)
        except Exception:
            proc.kill()
            proc.wait()
        client.close()
