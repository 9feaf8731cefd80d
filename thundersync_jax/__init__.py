"""thundersync_jax: lossless gradient streaming for agentic RL post-training on JAX."""

__version__ = "0.1.0"
