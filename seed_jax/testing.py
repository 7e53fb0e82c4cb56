"""Shared fakes for tests and demos: tiny model configs built in code."""

from __future__ import annotations

from seed_jax import model as model_lib


def tiny_config(family: str = "llama", **kw) -> model_lib.ModelConfig:
  """A tiny decoder config (2 layers, hidden 64) of the given family."""
  base = dict(
      family=family, vocab_size=128, hidden_size=64, intermediate_size=96,
      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
      rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
      attention_bias=family == "qwen2", qk_norm=family == "qwen3",
      eos_token_ids=(1,), pad_token_id=0, bos_token_id=2)
  base.update(kw)
  return model_lib.ModelConfig(**base)
