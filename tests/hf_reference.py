"""Builders of PyTorch reference models (transformers) for parity tests."""

import numpy as np
import torch
import transformers

FAMILY_CONFIGS = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}


def torch_model(family, *, seed=0, **kw):
  """A random transformers causal LM of the given family, float32, eval mode."""
  base = dict(vocab_size=128, hidden_size=64, intermediate_size=96,
              num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, initializer_range=0.2,
              tie_word_embeddings=False, pad_token_id=0, bos_token_id=2,
              eos_token_id=1)
  base.update(kw)
  cfg = FAMILY_CONFIGS[family](**base)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg)
  with torch.no_grad():  # norms and biases start at 1/0; randomize them too
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model.float().eval()


def torch_logits(model, tokens, mask):
  """Reference logits for left-padded tokens [B, T] and mask [B, T]."""
  t = torch.tensor(np.asarray(tokens), dtype=torch.long)
  m = torch.tensor(np.asarray(mask), dtype=torch.long)
  pos = (m.cumsum(-1) - 1).clamp(min=0)
  with torch.no_grad():
    out = model(input_ids=t, attention_mask=m, position_ids=pos)
  return out.logits.float().numpy()


def left_padded_batch(rng, vocab, lengths, total):
  """Random tokens [B, total] left-padded to `total`, and their mask."""
  toks = np.zeros((len(lengths), total), np.int32)
  mask = np.zeros((len(lengths), total), np.int32)
  for i, n in enumerate(lengths):
    toks[i, total - n:] = rng.integers(3, vocab, size=n)
    mask[i, total - n:] = 1
  return toks, mask
