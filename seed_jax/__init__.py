"""seed_jax: train LLM agents with SEED (self-evolving on-policy distillation) in JAX."""

__version__ = "0.1.0"
