"""Parity of the Flax decoder with the transformers (PyTorch) reference."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import testing
from seed_jax import token_ids
from tests import hf_reference

CASES = {
    "llama_untied": ("llama", {}),
    "llama_tied_headdim": ("llama", dict(tie_word_embeddings=True, head_dim=24)),
    "llama_bias_llama3rope": ("llama", dict(
        attention_bias=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0,
                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})),
    "qwen2": ("qwen2", {}),
    "qwen2_tied_mha": ("qwen2", dict(tie_word_embeddings=True,
                                     num_key_value_heads=4)),
    "qwen3": ("qwen3", dict(head_dim=32)),
    "qwen3_tied_mqa": ("qwen3", dict(tie_word_embeddings=True,
                                     num_key_value_heads=1, head_dim=8)),
    "qwen3_bias": ("qwen3", dict(attention_bias=True, head_dim=16)),
}


def _saved(tmp_path, family, kw):
  ref = hf_reference.torch_model(family, **kw)
  ref.save_pretrained(tmp_path)
  return ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, tmp_path):
  family, kw = CASES[case]
  ref = _saved(tmp_path, family, kw)
  config, params = hf.load_pretrained(str(tmp_path))
  assert config.family == family
  rng = np.random.default_rng(0)
  toks, mask = hf_reference.left_padded_batch(rng, 128, [13, 7, 20, 1], 20)
  ours = np.asarray(model_lib.apply(params, toks, mask, config=config))
  theirs = hf_reference.torch_logits(ref, toks, mask)
  real = mask.astype(bool)
  diff = np.abs(ours - theirs)[real].max()
  print(f"{case}: max |logit diff| = {diff:.2e}")
  assert diff <= 1e-4, diff


def test_long_sequence_matches_transformers(tmp_path):
  # 150 tokens: attention runs in several query blocks (64, 64, 22).
  ref = _saved(tmp_path, "qwen2", {})
  config, params = hf.load_pretrained(str(tmp_path))
  rng = np.random.default_rng(3)
  toks, mask = hf_reference.left_padded_batch(rng, 128, [150, 90, 1], 150)
  ours = np.asarray(model_lib.apply(params, toks, mask, config=config))
  theirs = hf_reference.torch_logits(ref, toks, mask)
  diff = np.abs(ours - theirs)[mask.astype(bool)].max()
  assert diff <= 1e-4, diff


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-5), ("bfloat16", 0.1)])
def test_cached_prefill_and_steps_match_full_forward(dtype, atol):
  cfg = testing.tiny_config(family="qwen3", dtype=dtype, param_dtype=dtype)
  params = model_lib.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(4)
  P, n = 130, 3  # a prefill in three query blocks, then n single steps
  toks, mask = hf_reference.left_padded_batch(rng, 128, [130, 70], P + n)
  full = np.asarray(model_lib.apply(params, toks, mask, config=cfg))
  S = P + n + 2  # spare slots stay masked
  kv_mask = np.concatenate([mask[:, :P], np.zeros((2, S - P), np.int32)], 1)
  pos = np.asarray(model_lib.positions_from_mask(mask))
  cache = model_lib.init_cache(cfg, 2, S)
  step = jax.jit(functools.partial(model_lib.forward, config=cfg))
  hidden, cache = model_lib.forward(params, toks[:, :P], pos[:, :P], kv_mask,
                                    config=cfg, cache=cache, cache_index=0)
  got = [model_lib.logits(params, hidden, config=cfg)]
  for i in range(P, P + n):
    kv_mask[:, i] = 1
    hidden, cache = step(params, toks[:, i:i + 1], pos[:, i:i + 1], kv_mask,
                         cache=cache, cache_index=jnp.int32(i))
    got.append(model_lib.logits(params, hidden, config=cfg))
  got = np.concatenate([np.asarray(g, np.float32) for g in got], axis=1)
  real = mask.astype(bool)
  assert np.abs(got - full)[real].max() <= atol * max(1, np.abs(full).max())


def test_segments_equal_separate_forwards():
  cfg = testing.tiny_config(family="llama")
  params = model_lib.init_params(cfg, jax.random.key(1))
  rng = np.random.default_rng(5)
  a, ma = hf_reference.left_padded_batch(rng, 128, [70, 9], 80)
  b, mb = hf_reference.left_padded_batch(rng, 128, [100, 40], 100)
  run = lambda t, m, **kw: np.asarray(model_lib.forward(
      params, t, model_lib.positions_from_mask(m), m, config=cfg, **kw)[0])
  # The positions of a packed row count from the start of each segment.
  pos = np.concatenate([model_lib.positions_from_mask(ma),
                        model_lib.positions_from_mask(mb)], 1)
  packed = np.asarray(model_lib.forward(
      params, np.concatenate([a, b], 1), pos, np.concatenate([ma, mb], 1),
      config=cfg, segments=(80, 100))[0])
  np.testing.assert_allclose(packed[:, :80][ma.astype(bool)],
                             run(a, ma)[ma.astype(bool)], atol=1e-5)
  np.testing.assert_allclose(packed[:, 80:][mb.astype(bool)],
                             run(b, mb)[mb.astype(bool)], atol=1e-5)
  with pytest.raises(ValueError, match="do not sum"):
    run(a, ma, segments=(40, 41))


@pytest.mark.parametrize("block", [0, 16, 200])
def test_attention_blocks_compute_the_same(block):
  # The block size changes how attention is split, not what it computes:
  # a packed forward in two segments and a cached prefill, each against the
  # CPU default of 64-query blocks.
  cfg = testing.tiny_config(family="qwen3")
  other = cfg.replace(attention_block=block)
  params = model_lib.init_params(cfg, jax.random.key(2))
  rng = np.random.default_rng(6)
  toks, mask = hf_reference.left_padded_batch(rng, 128, [150, 60], 180)
  pos = np.concatenate([model_lib.positions_from_mask(mask[:, :100]),
                        model_lib.positions_from_mask(mask[:, 100:])], 1)

  @functools.partial(jax.jit, static_argnames="config")
  def run(params, config):
    packed, _ = model_lib.forward(params, toks, pos, mask, config=config,
                                  segments=(100, 80))
    cache = model_lib.init_cache(config, 2, 180)
    prefill, _ = model_lib.forward(params, toks, pos, mask, config=config,
                                   cache=cache, cache_index=0)
    return packed, prefill

  real = mask.astype(bool)
  for got, want in zip(run(params, other), run(params, cfg)):
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real],
                               atol=1e-5)
  assert model_lib._query_blocks(0, 150, block) == (
      [(0, 150)] if block in (0, 200) else
      [(b, min(b + 16, 150)) for b in range(0, 150, 16)])
  with pytest.raises(ValueError, match="attention_block"):
    cfg.replace(attention_block=-1)


def test_config_from_hf_fields():
  cfg = model_lib.ModelConfig.from_hf({
      "model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1,
      "rope_theta": 5.0, "tie_word_embeddings": True, "eos_token_id": [3, 4]})
  assert cfg.attention_bias and not cfg.o_bias and not cfg.qk_norm
  assert cfg.head_dim == 4 and cfg.rope_theta == 5.0 and cfg.tie_embeddings
  assert cfg.eos_token_ids == (3, 4)


def test_bfloat16_close_to_float32(tmp_path):
  _saved(tmp_path, "llama", {})
  config, params = hf.load_pretrained(str(tmp_path))
  cfg16, params16 = hf.load_pretrained(str(tmp_path), dtype="bfloat16",
                                       param_dtype="bfloat16")
  assert params16["layers"]["q_kernel"].dtype == jax.numpy.bfloat16
  toks, mask = hf_reference.left_padded_batch(np.random.default_rng(1), 128,
                                              [9, 5], 9)
  a = np.asarray(model_lib.apply(params, toks, mask, config=config))
  b = np.asarray(model_lib.apply(params16, toks, mask, config=cfg16))
  # bfloat16 keeps ~3 significant digits; the argmax rarely moves.
  assert np.abs(a - b)[mask.astype(bool)].max() < 0.1 * np.abs(a).max()


def test_every_param_has_logical_axes():
  for family in model_lib.FAMILIES:
    cfg = model_lib.ModelConfig.from_hf({
        "model_type": family, "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 4, "num_hidden_layers": 2,
        "num_attention_heads": 2})
    shapes = model_lib.param_shapes(cfg)
    axes = model_lib.logical_axes(cfg)
    flat_s = jax.tree_util.tree_leaves_with_path(shapes)
    flat_a = dict(jax.tree_util.tree_leaves_with_path(
        axes, is_leaf=lambda x: isinstance(x, tuple)))
    for path, s in flat_s:
      assert len(flat_a[path]) == len(s.shape), path


def test_roundtrip_save_load(tmp_path):
  _saved(tmp_path / "a", "qwen3", {})
  config, params = hf.load_pretrained(str(tmp_path / "a"))
  hf.save_pretrained(str(tmp_path / "b"), config, params)
  config2, params2 = hf.load_pretrained(str(tmp_path / "b"))
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params, params2)
  # Sharded save: several files and an index, loaded back identically.
  hf.save_pretrained(str(tmp_path / "c"), config, params,
                     max_shard_bytes=20_000)
  files = [f for f in os.listdir(tmp_path / "c") if f.endswith(".safetensors")]
  assert len(files) > 1
  _, params3 = hf.load_pretrained(str(tmp_path / "c"))
  jax.tree.map(np.testing.assert_array_equal, params, params3)


def test_a_failed_save_leaves_the_folder_as_it_was(tmp_path):
  config = testing.tiny_config(family="llama")
  params = model_lib.init_params(config, jax.random.key(1))
  folder = str(tmp_path / "m")
  hf.save_pretrained(folder, config, params, max_shard_bytes=20_000)
  before = sorted(os.listdir(folder))
  assert "model.safetensors.index.json" in before
  with pytest.raises(TypeError):
    hf.save_pretrained(folder, config, params, dtype="bf16")  # not a dtype
  big = jax.tree.map(lambda x: x, params)
  big["final_norm"]["scale"] = big["final_norm"]["scale"].at[0].set(1e6)
  with pytest.raises(ValueError, match="model.norm.weight overflows float16"):
    hf.save_pretrained(folder, config, big, dtype="float16")
  assert sorted(os.listdir(folder)) == before
  _, back = hf.load_pretrained(folder)
  jax.tree.map(np.testing.assert_array_equal, params, back)
  # One file over a sharded save: the shards and their index go.
  hf.save_pretrained(folder, config, params)
  assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
  _, back = hf.load_pretrained(folder)
  jax.tree.map(np.testing.assert_array_equal, params, back)


@pytest.mark.parametrize("family,kw,message", [
    ("llama", dict(attention_bias=True), "attention_bias == o_bias"),
    ("qwen2", dict(attention_bias=False), "q/k/v biases"),
    ("qwen3", dict(qk_norm=False), "qk_norm=True"),
    ("llama", dict(qk_norm=True), "qk_norm=False"),
])
def test_a_config_the_family_cannot_say_is_not_saved(tmp_path, family, kw,
                                                     message):
  # transformers would load such a folder without the extra biases or norms.
  config = testing.tiny_config(family=family, **kw)
  params = model_lib.init_params(config, jax.random.key(0))
  with pytest.raises(ValueError, match=f"cannot be written .*{message}"):
    hf.save_pretrained(str(tmp_path / "m"), config, params)
  assert not (tmp_path / "m").exists()


def test_gguf_tensors_the_layout_does_not_use_are_refused(monkeypatch):
  import gguf  # pylint: disable=g-import-not-at-top
  real = gguf.GGUFReader(hf.smollm2_gguf_path())

  class Extra:
    name = "blk.0.attn_q.bias"

  class Reader:
    fields, tensors = real.fields, list(real.tensors) + [Extra()]

  monkeypatch.setattr(gguf, "GGUFReader", lambda path: Reader())
  with pytest.raises(ValueError, match="holds 1 tensor.s. the Llama layout "
                     "does not use, e.g. \\['blk.0.attn_q.bias'\\]"):
    hf.load_gguf()
  Extra.name = "rope_freqs.weight"  # Llama 3's RoPE scaling
  with pytest.raises(ValueError, match="uses RoPE scaling"):
    hf.load_gguf()


def test_missing_shard_is_named(tmp_path):
  ref = hf_reference.torch_model("llama")
  ref.save_pretrained(tmp_path, max_shard_size="20KB")
  shards = sorted(f for f in os.listdir(tmp_path)
                  if f.endswith(".safetensors"))
  assert len(shards) > 1
  os.remove(tmp_path / shards[1])
  with pytest.raises(FileNotFoundError, match=shards[1]):
    hf.load_pretrained(str(tmp_path))


def test_unsupported_architecture_is_named(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(
      {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
  with pytest.raises(ValueError, match="gpt2"):
    hf.load_config(str(tmp_path))


def test_missing_gguf_is_named(tmp_path):
  missing = str(tmp_path / "nope.gguf")
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    hf.load_gguf(missing)
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    hf.load_tokenizer(gguf_file=missing)


def test_vocab_mismatch_is_named():
  class Tok:
    def __len__(self):
      return 200
  cfg = model_lib.ModelConfig.from_hf({
      "model_type": "llama", "vocab_size": 128, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1,
      "num_attention_heads": 2})
  with pytest.raises(ValueError, match="vocabulary mismatch"):
    hf.check_vocab(Tok(), cfg)


def test_smollm2_logits_match_transformers(smollm2, smollm2_torch):
  import torch
  config, params, tok = smollm2
  assert config.num_layers == 30 and config.tie_embeddings
  hf.check_vocab(tok, config)
  text = tok.apply_chat_template(
      [{"role": "user", "content": "Name three colours of the rainbow."}],
      tokenize=False, add_generation_prompt=True)
  assert text.startswith("<|im_start|>system")
  ids = np.asarray([tok.encode(text)], np.int32)
  ours = np.asarray(model_lib.apply(params, ids, np.ones_like(ids),
                                    config=config))
  with torch.no_grad():
    theirs = smollm2_torch(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  diff = np.abs(ours - theirs).max()
  scale = np.abs(theirs).max()
  print(f"SmolLM2 max |logit diff| = {diff:.2e} (max |logit| {scale:.1f})")
  # float32 rounding over 30 layers: a few 1e-6 of the logit scale.
  assert diff <= 1e-5 * scale, (diff, scale)
  assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def _logit_diff(ref, config, params):
  rng = np.random.default_rng(0)
  toks, mask = hf_reference.left_padded_batch(rng, 128, [9, 4], 9)
  ours = np.asarray(model_lib.apply(params, toks, mask, config=config))
  theirs = hf_reference.torch_logits(ref, toks, mask)
  return np.abs(ours - theirs)[mask.astype(bool)].max()


def test_qwen3_without_head_dim_takes_transformers_default(tmp_path):
  # Qwen3Config defaults head_dim to 128, not hidden_size / heads (16 here).
  ref = _saved(tmp_path, "qwen3", {})
  cfg = json.loads((tmp_path / "config.json").read_text())
  assert cfg.pop("head_dim") == 128
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  config, params = hf.load_pretrained(str(tmp_path))
  assert config.head_dim == 128
  assert _logit_diff(ref, config, params) <= 1e-4


def test_saved_qwen3_keeps_its_attention_bias(tmp_path):
  ref = _saved(tmp_path / "a", "qwen3", dict(attention_bias=True, head_dim=16))
  config, params = hf.load_pretrained(str(tmp_path / "a"))
  hf.save_pretrained(str(tmp_path / "b"), config, params)
  assert json.loads((tmp_path / "b" / "config.json").read_text())[
      "attention_bias"] is True
  config2, params2 = hf.load_pretrained(str(tmp_path / "b"))
  assert config2.o_bias and config2.attention_bias
  assert _logit_diff(ref, config2, params2) <= 1e-4


def test_tensors_the_config_does_not_use_are_an_error(tmp_path):
  # A llama checkpoint with biases whose config.json lost attention_bias:
  # loading it without them would give wrong logits.
  _saved(tmp_path, "llama", dict(attention_bias=True))
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["attention_bias"] = False
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"does not account for.*proj\.bias"):
    hf.load_pretrained(str(tmp_path))


def test_tensor_that_does_not_fit_the_heads_is_named(tmp_path):
  _saved(tmp_path, "llama", dict(head_dim=24))
  cfg = json.loads((tmp_path / "config.json").read_text())
  del cfg["head_dim"]  # 64 / 4 = 16 instead of 24
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj"):
    hf.load_pretrained(str(tmp_path))


def test_saving_over_a_sharded_folder_replaces_its_weights(tmp_path):
  _saved(tmp_path / "a", "qwen2", {})
  config, params = hf.load_pretrained(str(tmp_path / "a"))
  hf.save_pretrained(str(tmp_path / "b"), config, params,
                     max_shard_bytes=20_000)
  assert (tmp_path / "b" / "model.safetensors.index.json").exists()
  changed = jax.tree.map(lambda x: x + 1.0, params)
  hf.save_pretrained(str(tmp_path / "b"), config, changed)
  assert sorted(f for f in os.listdir(tmp_path / "b")
                if f.startswith("model")) == ["model.safetensors"]
  _, loaded = hf.load_pretrained(str(tmp_path / "b"))
  jax.tree.map(np.testing.assert_array_equal, changed, loaded)


def test_truncated_or_pointer_safetensors_is_named(tmp_path):
  _saved(tmp_path, "llama", {})
  path = tmp_path / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match=r"model\.safetensors.*truncated"):
    hf.load_pretrained(str(tmp_path))
  path.write_text("version https://git-lfs.github.com/spec/v1\n"
                  "oid sha256:0123\nsize 123456\n")
  with pytest.raises(ValueError, match=r"model\.safetensors.*Git LFS"):
    hf.load_pretrained(str(tmp_path))


def test_generation_config_eos_ids_are_added(tmp_path):
  _saved(tmp_path, "qwen2", dict(eos_token_id=1))
  (tmp_path / "generation_config.json").write_text(
      json.dumps({"eos_token_id": [1, 3]}))
  assert hf.load_config(str(tmp_path)).eos_token_ids == (1, 3)


def test_unsupported_config_fields_are_named():
  base = {"model_type": "llama", "vocab_size": 128, "hidden_size": 8,
          "intermediate_size": 4, "num_hidden_layers": 1,
          "num_attention_heads": 2}
  with pytest.raises(ValueError, match="hidden_act='gelu'"):
    model_lib.ModelConfig.from_hf({**base, "hidden_act": "gelu"})
  with pytest.raises(ValueError, match="low_freq_factor"):
    model_lib.ModelConfig.from_hf({**base, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0}})


def _edit_config(path, **changes):
  """Rewrites path/config.json with `changes` (None: the key removed)."""
  cfg = json.loads((path / "config.json").read_text())
  for k, v in changes.items():
    if v is None:
      cfg.pop(k, None)
    else:
      cfg[k] = v
  (path / "config.json").write_text(json.dumps(cfg))


def _transformers_load(path):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.AutoModelForCausalLM.from_pretrained(
      str(path), dtype=torch.float32).eval()


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("top_level_theta", [None, 1234.0])
def test_a_legacy_rope_scaling_replaces_rope_parameters(tmp_path,
                                                        top_level_theta):
  # transformers takes rope_scaling instead of rope_parameters, theta too:
  # rope_parameters' 500000 is not used, the top-level rope_theta or 10000 is.
  _saved(tmp_path, "llama", dict(rope_theta=500000.0))
  _edit_config(tmp_path, rope_scaling=_LLAMA3_ROPE, rope_theta=top_level_theta)
  theirs = _transformers_load(tmp_path)
  assert theirs.config.rope_parameters["rope_type"] == "llama3"
  config, params = hf.load_pretrained(str(tmp_path))
  assert config.rope_theta == (top_level_theta or 10000.0)
  assert config.rope_scaling == model_lib.RopeScaling(
      8.0, 1.0, 4.0, 16)
  assert _logit_diff(theirs, config, params) <= 1e-4


def test_a_legacy_rope_scaling_of_another_type_is_refused():
  base = {"model_type": "llama", "vocab_size": 128, "hidden_size": 8,
          "intermediate_size": 4, "num_hidden_layers": 1,
          "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
  # Merged into rope_parameters, its rope_type "default" won: a linear
  # scaling was silently dropped.
  with pytest.raises(ValueError, match="unsupported rope_type 'linear'"):
    model_lib.ModelConfig.from_hf(
        {**base, "rope_scaling": {"type": "linear", "factor": 4.0}})


@pytest.mark.parametrize("change,match", [
    ({"num_key_value_heads": 0}, r"positive integers: num_kv_heads=0"),
    ({"head_dim": 0}, r"positive integers: head_dim=0"),
    ({"hidden_size": "8"}, r"positive integers: hidden_size='8'"),
    ({"num_hidden_layers": True}, r"positive integers: num_hidden_layers=True"),
    ({"eos_token_id": "</s>"},
     r"token ids must be .*: eos_token_id\[0\]='</s>'"),
    ({"eos_token_id": [2, -1]}, r"eos_token_id\[1\]=-1"),
    ({"pad_token_id": 1.5}, r"pad_token_id=1.5"),
])
def test_odd_config_values_are_named(change, match):
  base = {"model_type": "llama", "vocab_size": 128, "hidden_size": 8,
          "intermediate_size": 4, "num_hidden_layers": 1,
          "num_attention_heads": 2}
  with pytest.raises(ValueError, match=match):
    model_lib.ModelConfig.from_hf({**base, **change})


def test_a_negative_pad_id_is_no_pad_and_numpy_sizes_become_ints(caplog):
  base = {"model_type": "llama", "vocab_size": 128, "hidden_size": 8,
          "intermediate_size": 4, "num_hidden_layers": 1,
          "num_attention_heads": 2}
  with caplog.at_level("WARNING"):
    config = model_lib.ModelConfig.from_hf({**base, "pad_token_id": -1})
  assert config.pad_token_id is None  # as transformers loads it (a warning)
  assert "pad_token_id=-1" in caplog.text
  config = model_lib.ModelConfig.from_hf(
      {**base, "vocab_size": np.int64(128), "eos_token_id": [np.int32(2)]})
  assert type(config.vocab_size) is int and config.eos_token_ids == (2,)
  json.dumps(config.to_hf())  # numpy ints would not serialize


def test_a_llama3_rope_is_written_for_old_and_new_readers(tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  config = testing.tiny_config("llama").replace(
      rope_theta=5e5, rope_scaling=model_lib.RopeScaling(8.0, 1.0, 4.0, 16))
  out = config.to_hf()
  # transformers < 5 reads rope_scaling and the top-level theta.
  assert out["rope_scaling"] == {
      "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
  assert out["rope_theta"] == 5e5
  assert model_lib.ModelConfig.from_hf(out) == config
  theirs = transformers.LlamaConfig(**out)
  assert theirs.rope_parameters == out["rope_parameters"]
  assert "rope_scaling" not in config.replace(rope_scaling=None).to_hf()


def test_a_config_without_a_size_is_named(tmp_path):
  _saved(tmp_path, "qwen2", {})
  _edit_config(tmp_path, intermediate_size=None, num_hidden_layers=None)
  with pytest.raises(ValueError, match="config.json lacks intermediate_size, "
                     "num_hidden_layers"):
    hf.load_pretrained(str(tmp_path))


def _rewrite_tensors(path, change):
  """Rewrites path/model.safetensors with change(tensors) (a dict)."""
  file = str(path / "model.safetensors")
  tensors = {k: np.array(v) for k, v in hf.read_safetensors(file).items()}
  change(tensors)
  hf.write_safetensors(file, tensors)


def test_a_tied_config_with_its_own_lm_head_loads_as_transformers(tmp_path):
  # config.json says tied, the checkpoint has a distinct lm_head: transformers
  # unties them and uses it.
  _saved(tmp_path, "llama", {})
  _edit_config(tmp_path, tie_word_embeddings=True)
  theirs = _transformers_load(tmp_path)
  config, params = hf.load_pretrained(str(tmp_path))
  assert not config.tie_embeddings and "lm_head" in params
  assert _logit_diff(theirs, config, params) <= 1e-4
  # An explicit override is kept.
  config, params = hf.load_pretrained(str(tmp_path), tie_embeddings=True)
  assert config.tie_embeddings and "lm_head" not in params


def test_a_tied_checkpoint_with_an_equal_or_only_lm_head_stays_tied(tmp_path):
  _saved(tmp_path, "qwen2", dict(tie_word_embeddings=True))
  embed = "model.embed_tokens.weight"
  _rewrite_tensors(tmp_path, lambda t: t.update({"lm_head.weight": t[embed]}))
  theirs = _transformers_load(tmp_path)
  config, params = hf.load_pretrained(str(tmp_path))
  assert config.tie_embeddings and "lm_head" not in params
  assert _logit_diff(theirs, config, params) <= 1e-4
  # Only lm_head.weight: transformers ties the embedding to it.
  _rewrite_tensors(tmp_path, lambda t: t.pop(embed))
  theirs = _transformers_load(tmp_path)
  config, params = hf.load_pretrained(str(tmp_path))
  assert config.tie_embeddings and "lm_head" not in params
  assert _logit_diff(theirs, config, params) <= 1e-4


@pytest.mark.parametrize("eos,written", [((), None), ((1,), 1),
                                         ((1, 3), [1, 3])])
def test_eos_ids_are_written_as_transformers_reads_them(tmp_path, eos,
                                                        written):
  # No EOS was written as "eos_token_id": [], and transformers' generate()
  # took that empty list's first id (IndexError): it is null now.
  import torch  # pylint: disable=g-import-not-at-top
  config = testing.tiny_config("llama", eos_token_ids=eos, pad_token_id=None)
  hf.save_pretrained(str(tmp_path), config,
                     model_lib.init_params(config, jax.random.key(0)))
  value = json.loads((tmp_path / "config.json").read_text())["eos_token_id"]
  assert value == written and type(value) is type(written)
  assert hf.load_config(str(tmp_path)) == config
  out = _transformers_load(tmp_path).generate(
      torch.tensor([[3, 4, 5]]), max_new_tokens=2, do_sample=False)
  assert out[0, :3].tolist() == [3, 4, 5]


_QWEN2 = {"model_type": "qwen2", "vocab_size": 128, "hidden_size": 8,
          "intermediate_size": 4, "num_hidden_layers": 2,
          "num_attention_heads": 2}


@pytest.mark.parametrize("fields,refused", [
    # Layers from max_window_layers (28 when absent) on slide: none of 2.
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=2),
     None),
    (dict(use_sliding_window=True, sliding_window=4), None),
    (dict(use_sliding_window=True, sliding_window=None, max_window_layers=0),
     None),
    (dict(use_sliding_window=True, max_window_layers=0,
          layer_types=["full_attention"] * 2), None),  # the list wins
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
     r"sliding-window attention, .*\(layers \[1\] of 2\)"),
    (dict(use_sliding_window=True, max_window_layers=0),  # window 4096
     r"sliding-window attention, .*\(layers \[0, 1\] of 2\)"),
    (dict(layer_types=["sliding_attention", "full_attention"]),
     r"sliding-window attention, .*\(layers \[0\] of 2\)"),
    (dict(layer_types=["full_attention", "linear_attention"]),
     r"layer_types ask for \['linear_attention'\]"),
])
def test_sliding_window_is_refused_only_where_a_layer_slides(fields, refused):
  # Qwen2 and Qwen3 folders may say use_sliding_window=true with no layer
  # sliding; every such config was refused.
  import transformers  # pylint: disable=g-import-not-at-top
  kinds = transformers.Qwen2Config(**{**_QWEN2, **fields}).layer_types
  assert ("full_attention" in kinds and len(set(kinds)) == 1) == (
      refused is None)
  for family in ("qwen2", "qwen3"):
    hf_cfg = {**_QWEN2, "model_type": family, **fields}
    if refused is None:
      assert model_lib.ModelConfig.from_hf(hf_cfg).num_layers == 2
    else:
      with pytest.raises(ValueError, match=refused):
        model_lib.ModelConfig.from_hf(hf_cfg)
  # A llama config.json's are ignored, at any depth (as transformers does:
  # test_a_llama_config_ignores_sliding_window_fields_as_transformers_does).
  for layers in (2, 32):
    hf_cfg = {**_QWEN2, "model_type": "llama", "num_hidden_layers": layers,
              **{k: v for k, v in fields.items() if k != "layer_types"}}
    assert model_lib.ModelConfig.from_hf(hf_cfg).num_layers == layers


def test_a_llama_config_ignores_sliding_window_fields_as_transformers_does(
    tmp_path):
  # Every layer would slide under the Qwen rule, with a window of 4 over 9
  # tokens; LlamaForCausalLM attends to every earlier token all the same.
  _saved(tmp_path, "llama", {})
  _edit_config(tmp_path, use_sliding_window=True, sliding_window=4,
               max_window_layers=0)
  theirs = _transformers_load(tmp_path)
  config, params = hf.load_pretrained(str(tmp_path))
  assert _logit_diff(theirs, config, params) <= 1e-4


@pytest.mark.parametrize("family,kw", [("qwen2", {}),
                                       ("qwen3", dict(head_dim=16))])
def test_a_sliding_window_no_layer_uses_matches_transformers(tmp_path, family,
                                                             kw):
  # A window of 4 over 9 tokens would change the logits if a layer slid.
  _saved(tmp_path, family, kw)
  _edit_config(tmp_path, use_sliding_window=True, sliding_window=4,
               max_window_layers=2, layer_types=None)
  theirs = _transformers_load(tmp_path)
  assert theirs.config.layer_types == ["full_attention"] * 2
  config, params = hf.load_pretrained(str(tmp_path))
  assert _logit_diff(theirs, config, params) <= 1e-4


def test_a_shape_dtype_struct_reaches_jit_s_own_error_not_the_id_check():
  """A ShapeDtypeStruct has no ids to check: the host check lets it through,
  and the call fails with jit's error naming the argument, not a TypeError
  from comparing the struct with 0."""
  shape = jax.ShapeDtypeStruct((2, 3), jnp.int32)
  assert token_ids.check_token_ids(10, {"ids": shape}, {"ids": shape}) is None
  checked = token_ids.host_checked(
      lambda ids: token_ids.check_token_ids(10, {"ids": ids}))(
          jax.jit(lambda ids: ids + 1))
  with pytest.raises(TypeError, match="Argument 'ids' of shape int32"
                     r"\[2,3\] of type .*ShapeDtypeStruct.* is not a valid"):
    checked(shape)
  # Its lowering, which takes shapes, is unchecked as before.
  assert checked.lower(shape).compile()(jnp.zeros((2, 3), jnp.int32)).sum() == 6
  # Real ids are still checked.
  with pytest.raises(ValueError, match=r"ids: token id\(s\) 10 outside"):
    checked(jnp.full((2, 3), 10, jnp.int32))
