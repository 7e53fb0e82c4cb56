"""Sampler: golden sequences, parity with transformers.generate, compile counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from seed_jax import hf
from seed_jax import model as model_lib
from seed_jax import sampler
from seed_jax import scorer
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib
from tests import hf_reference

V = 32


def _plus_one_model():
  """A real decoder whose greedy next token is (previous + 1) mod V.

  Blocks add nothing (zero output projections); the embedding is one-hot and
  the head shifts it by one, so logits = sqrt(V) * onehot(prev + 1).
  """
  cfg = testing.tiny_config(vocab_size=V, hidden_size=V, num_layers=1,
                            eos_token_ids=())
  params = model_lib.init_params(cfg, jax.random.key(0))
  params["layers"]["o_kernel"] = jnp.zeros_like(params["layers"]["o_kernel"])
  params["layers"]["down_kernel"] = jnp.zeros_like(
      params["layers"]["down_kernel"])
  params["embed"]["embedding"] = jnp.eye(V)
  params["lm_head"]["kernel"] = jnp.roll(jnp.eye(V), 1, axis=1)
  return cfg, params


def test_golden_plus_one():
  cfg, params = _plus_one_model()
  batch = sampler.pad_left([[5, 6, 7], [10], [3, 4]], buckets=(4,))
  out = sampler.sample(params, batch.tokens, batch.mask, jax.random.key(0),
                       config=cfg, max_new_tokens=6, eos_ids=(12,),
                       stop_seqs=((5, 6),), pad_id=0)
  np.testing.assert_array_equal(out.tokens, [[8, 9, 10, 11, 12, 0],
                                             [11, 12, 0, 0, 0, 0],
                                             [5, 6, 0, 0, 0, 0]])
  np.testing.assert_array_equal(out.lengths, [5, 2, 2])
  np.testing.assert_array_equal(out.done, [True, True, True])
  # logits = a * onehot, a = 1 / rms(onehot) = (1/V + eps) ** -0.5.
  a = (1 / V + cfg.rms_norm_eps) ** -0.5
  expected = a - np.log(np.exp(a) + V - 1)
  lp = np.asarray(out.logprobs)
  np.testing.assert_allclose(lp[0, :5], expected, rtol=1e-5)
  assert (lp[0, 5:] == 0).all() and (lp[1, 2:] == 0).all()


def test_budget_exhausted_rows_are_not_done():
  cfg, params = _plus_one_model()
  batch = sampler.pad_left([[1], [20]], buckets=(2,))
  out = sampler.sample(params, batch.tokens, batch.mask, jax.random.key(0),
                       config=cfg, max_new_tokens=4, eos_ids=(4,))
  np.testing.assert_array_equal(out.tokens, [[2, 3, 4, 0], [21, 22, 23, 24]])
  np.testing.assert_array_equal(out.lengths, [3, 4])
  np.testing.assert_array_equal(out.done, [True, False])


def test_filler_rows_sample_nothing():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(3))
  b = sampler.pad_left([[5, 6, 7], [8, 9], [5, 6, 7], [5, 6, 7]],
                       buckets=(4,))
  kw = dict(config=cfg, max_new_tokens=8, sampling=sampler.Temperature(1.0),
            eos_ids=(3,))
  every = sampler.sample(params, b.tokens, b.mask, jax.random.key(1), **kw)
  live = sampler.sample(params, b.tokens, b.mask, jax.random.key(1),
                        live=np.array([True, True, False, False]), **kw)
  # The live rows are what they would be; the filler rows start done.
  for field in ("tokens", "logprobs", "lengths", "done"):
    np.testing.assert_array_equal(getattr(live, field)[:2],
                                  getattr(every, field)[:2])
  np.testing.assert_array_equal(live.lengths[2:], 0)
  assert (np.asarray(live.tokens)[2:] == 0).all()


def test_sampling_edge_cases():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  key = jax.random.key(7)
  # k past the vocabulary keeps every token; p = 1 is plain sampling.
  keys = jax.random.split(jax.random.key(0), 400)
  draw = jax.jit(jax.vmap(lambda k, m: m(logits, k)[0], in_axes=(0, None)),
                 static_argnums=1)
  assert set(np.asarray(draw(keys, sampler.TopK(9)))) == {0, 1, 2, 3}
  tail = jnp.concatenate([jnp.zeros((1, 1)), jnp.full((1, 40000), -12.0)], 1)
  np.testing.assert_array_equal(
      sampler.TopP(1.0)(tail, key), sampler.Temperature(1.0)(tail, key))
  # Buckets in any order: the smallest that fits.
  assert sampler.pad_left([[1, 2, 3]], buckets=(8, 4)).tokens.shape == (1, 4)


METHODS = (sampler.Greedy(), sampler.Temperature(1.0), sampler.TopK(3),
           sampler.TopP(0.9), sampler.TopP(1.0))


def test_nan_logits_give_every_method_the_first_nans_id():
  nan = jnp.nan
  logits = jnp.asarray([[nan] * V,  # a diverged model: every logit NaN
                        [0.0, 1.0, nan, 2.0, nan] + [0.0] * (V - 5),
                        [0.0, 3.0] + [1.0] * (V - 2)])  # no NaN
  for method in METHODS:
    got = np.asarray(jax.jit(method)(logits, jax.random.key(0)))
    # The first NaN's id, as jnp.argmax: never an id past the vocabulary
    # (Greedy gave V, which decodes as no text and is no token to score).
    np.testing.assert_array_equal(got[:2], [0, 2], err_msg=str(method))
  np.testing.assert_array_equal(
      jax.jit(sampler.Greedy())(logits, None), jnp.argmax(logits, axis=-1))


def test_a_model_with_nan_params_samples_ids_in_the_vocabulary():
  cfg, params = _plus_one_model()
  params = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), params)
  b = sampler.pad_left([[5, 6], [7]], buckets=(4,))
  for method in (sampler.Greedy(), sampler.Temperature(1.0)):
    out = sampler.sample(params, b.tokens, b.mask, jax.random.key(0),
                         config=cfg, max_new_tokens=3, sampling=method)
    tokens = np.asarray(out.tokens)
    assert ((tokens >= 0) & (tokens < V)).all(), (method, tokens)
    assert np.isnan(np.asarray(out.logprobs)).all()  # what callers check


def test_generate_text_refuses_a_model_with_nan_logits():
  tok = tokenizer_lib.train_tokenizer(["a b c d"] * 5, vocab_size=280)
  cfg = testing.tiny_config(vocab_size=len(tok), max_position_embeddings=32,
                            eos_token_ids=(tok.eos_token_id,))
  params = model_lib.init_params(cfg, jax.random.key(0))
  kw = dict(max_new_tokens=3, buckets=(8,))
  assert len(sampler.generate_text(params, cfg, tok, ["a b"], **kw)) == 1
  broken = dict(params, lm_head=jax.tree.map(
      lambda x: x.at[0, 0].set(jnp.nan), params["lm_head"]))
  with pytest.raises(ValueError, match="generate_text: 1 of 1 sampled "
                     "replies have NaN or infinite log-probs") as e:
    sampler.generate_text(broken, cfg, tok, ["a b"], **kw)
  assert isinstance(e.value, sampler.NonFiniteLogitsError)
  sampler.check_finite([[-1.0, -2.0], []], "fine")  # finite: no error
  with pytest.raises(ValueError, match=r"x: 1 of 2 .*\(the first: reply 1\)"):
    sampler.check_finite([[-1.0], [-1.0, float("-inf")]], "x")


def test_compiles_once_per_bucket():
  cfg, params = _plus_one_model()
  sampler.sample.clear_cache() if hasattr(sampler.sample, "clear_cache") else None
  kw = dict(config=cfg, max_new_tokens=3)
  for seqs in ([[1, 2]], [[3]], [[4, 5, 6]]):
    b = sampler.pad_left(seqs, buckets=(4, 8))
    sampler.sample(params, b.tokens, b.mask, jax.random.key(1), **kw)
  assert sampler.sample._cache_size() == 1
  b = sampler.pad_left([[1] * 6], buckets=(4, 8))
  sampler.sample(params, b.tokens, b.mask, jax.random.key(1), **kw)
  assert sampler.sample._cache_size() == 2


def test_deterministic_for_a_key():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(3))
  b = sampler.pad_left([[5, 6, 7], [8, 9]], buckets=(4,))
  for method in (sampler.Temperature(1.0), sampler.TopK(5, 0.7),
                 sampler.TopP(0.9)):
    run = lambda k: sampler.sample(params, b.tokens, b.mask, k, config=cfg,
                                   max_new_tokens=8, sampling=method)
    a, a2, c = run(jax.random.key(1)), run(jax.random.key(1)), run(
        jax.random.key(2))
    np.testing.assert_array_equal(a.tokens, a2.tokens)
    assert not np.array_equal(a.tokens, c.tokens)


def test_top_k_and_top_p_restrict_support():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  keys = jax.random.split(jax.random.key(0), 300)
  draw = jax.jit(jax.vmap(lambda k, m: m(logits, k)[0], in_axes=(0, None)),
                 static_argnums=1)
  assert set(np.asarray(draw(keys, sampler.TopK(2)))) == {0, 1}
  assert set(np.asarray(draw(keys, sampler.TopP(0.7)))) == {0, 1}
  assert set(np.asarray(draw(keys, sampler.TopP(0.81)))) == {0, 1, 2}


def test_sampler_logprobs_equal_scorer():
  cfg = testing.tiny_config(family="qwen3")
  params = model_lib.init_params(cfg, jax.random.key(4))
  b = sampler.pad_left([[5, 6, 7, 9], [8, 9], [11]], buckets=(8,))
  kw = dict(config=cfg, max_new_tokens=12, sampling=sampler.Temperature(0.7),
            eos_ids=(1,))
  out = sampler.sample(params, b.tokens, b.mask, jax.random.key(5), **kw)
  rmask = (np.arange(12)[None] < np.asarray(out.lengths)[:, None]).astype(
      np.int32)
  # Temperature-1 log-probs by default, whatever the sampling temperature.
  lp = scorer.score(params, b.tokens, b.mask, out.tokens, rmask, config=cfg,
                    chunk=5)
  diff = np.abs(np.asarray(lp) - np.asarray(out.logprobs)).max()
  assert diff <= 1e-4, diff
  # Asked for, at another temperature: the scorer's at that temperature (RL
  # at temperature 0.7 scores at 0.7); the same tokens, from the same key.
  at = sampler.sample(params, b.tokens, b.mask, jax.random.key(5), **kw,
                      logprob_temperature=0.7)
  np.testing.assert_array_equal(at.tokens, out.tokens)
  lp7 = scorer.score(params, b.tokens, b.mask, out.tokens, rmask, config=cfg,
                     chunk=5, temperature=0.7)
  diff = np.abs(np.asarray(lp7) - np.asarray(at.logprobs)).max()
  assert diff <= 1e-4, diff
  assert np.abs(np.asarray(lp7) - np.asarray(lp)).max() > 1e-2
  with pytest.raises(ValueError, match="logprob_temperature must be > 0"):
    sampler.sample(params, b.tokens, b.mask, jax.random.key(5), **kw,
                   logprob_temperature=0.0)


@pytest.mark.parametrize("family,kw", [
    ("llama", {}), ("llama", dict(tie_word_embeddings=True, head_dim=24)),
    ("qwen2", {}), ("qwen3", dict(head_dim=32))])
def test_greedy_matches_transformers_generate(family, kw, tmp_path):
  ref = hf_reference.torch_model(family, **kw)
  ref.save_pretrained(tmp_path)
  cfg, params = hf.load_pretrained(str(tmp_path), eos_token_ids=())
  rng = np.random.default_rng(0)
  toks, mask = hf_reference.left_padded_batch(rng, 128, [9, 4, 14], 14)
  n = 24
  out = sampler.sample(params, toks, mask, jax.random.key(0), config=cfg,
                       max_new_tokens=n)
  with torch.no_grad():
    gen = ref.generate(torch.tensor(toks, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long),
                       max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       pad_token_id=0, eos_token_id=None)
  np.testing.assert_array_equal(np.asarray(out.tokens), gen[:, 14:].numpy())


def test_smollm2_greedy_matches_transformers(smollm2, smollm2_torch):
  config, params, tok = smollm2
  chats = ["Explain in two sentences why the sky is blue.",
           "Write a haiku about the sea.",
           "List two prime numbers and explain briefly why they are prime."]
  texts = [tok.apply_chat_template([{"role": "user", "content": c}],
                                   tokenize=False, add_generation_prompt=True)
           for c in chats]
  ids = [tok.encode(t) for t in texts]
  b = sampler.pad_left(ids, buckets=(64,), pad_id=config.pad_token_id)
  n = 24
  out = sampler.sample(params, b.tokens, b.mask, jax.random.key(0),
                       config=config, max_new_tokens=n,
                       eos_ids=config.eos_token_ids,
                       pad_id=config.pad_token_id)
  with torch.no_grad():
    gen = smollm2_torch.generate(
        torch.tensor(b.tokens, dtype=torch.long),
        attention_mask=torch.tensor(b.mask, dtype=torch.long),
        max_new_tokens=n, do_sample=False, pad_token_id=config.pad_token_id)
  ref = gen[:, 64:].numpy()
  ours = np.asarray(out.tokens)[:, :ref.shape[1]]
  for row_ours, row_ref, length in zip(ours, ref, np.asarray(out.lengths)):
    np.testing.assert_array_equal(row_ours[:length], row_ref[:length])
  assert min(np.asarray(out.lengths)) >= 20
  print([tok.decode(r[:l]) for r, l in zip(ours, np.asarray(out.lengths))])


def test_bad_inputs():
  cfg, params = _plus_one_model()
  with pytest.raises(ValueError, match="use Greedy"):
    sampler.Temperature(0.0)
  with pytest.raises(ValueError, match="k >= 1"):
    sampler.TopK(0)
  with pytest.raises(ValueError, match="0 < p <= 1"):
    sampler.TopP(1.5)
  with pytest.raises(ValueError, match="empty batch"):
    sampler.pad_left([])
  with pytest.raises(ValueError, match="exceeds the largest bucket"):
    sampler.pad_left([[1] * 9], buckets=(4, 8))
  cut = sampler.pad_left([[1] * 9, [2] * 3], buckets=(4, 8), truncate=True)
  assert cut.truncated == 1 and cut.tokens.shape == (2, 8)
  b = sampler.pad_left([[1, 2]], buckets=(4,))
  with pytest.raises(ValueError, match="context"):
    sampler.sample(params, b.tokens, b.mask, jax.random.key(0), config=cfg,
                   max_new_tokens=cfg.max_position_embeddings)


def test_token_ids_outside_the_vocabulary_are_named():
  # The embedding lookup reads an id >= vocab_size as NaN (a padding
  # position's reaches its whole row) and a negative one as another token:
  # NaN or wrong log-probs, silently.
  cfg, params = _plus_one_model()
  b = sampler.pad_left([[5, 6, 7], [10]], buckets=(4,))
  kw = dict(config=cfg, max_new_tokens=3)
  out = sampler.sample(params, b.tokens, b.mask, jax.random.key(0), **kw)
  np.testing.assert_array_equal(out.tokens, [[8, 9, 10], [11, 12, 13]])
  traced = jax.jit(lambda t, m: sampler.sample(  # tracers: not checked
      params, t, m, jax.random.key(0), **kw).tokens)(b.tokens, b.mask)
  np.testing.assert_array_equal(traced, out.tokens)
  resp = np.array([[8, 9, 0], [11, 12, 13]], np.int32)
  rmask = np.array([[1, 1, 0], [1, 1, 1]], np.int32)
  lp = scorer.score(params, b.tokens, b.mask, resp, rmask, config=cfg)
  la, lb = scorer.score_dual(params, b.tokens, b.mask, b.tokens, b.mask,
                             resp, rmask, config=cfg)
  assert np.isfinite(lp).all() and np.isfinite(la).all()
  np.testing.assert_allclose(la, lp, atol=1e-5)
  np.testing.assert_allclose(lb, lp, atol=1e-5)
  for bad in (V, -1):
    said = (rf"token id\(s\) {bad} outside the model's vocabulary "
            rf"\(vocab_size={V}")
    toks = b.tokens.copy()
    toks[1, 3] = bad
    for arr in (toks, jnp.asarray(toks)):
      with pytest.raises(ValueError, match="prompts: " + said):
        sampler.sample(params, arr, b.mask, jax.random.key(0), **kw)
    with pytest.raises(ValueError, match="prompts: " + said):
      scorer.score(params, toks, b.mask, resp, rmask, config=cfg)
    with pytest.raises(ValueError, match="prompts_b: " + said):
      scorer.score_dual(params, b.tokens, b.mask, toks, b.mask, resp, rmask,
                        config=cfg)
    r = resp.copy()
    r[0, 1] = bad
    with pytest.raises(ValueError, match="responses: " + said):
      scorer.score(params, b.tokens, b.mask, r, rmask, config=cfg)
    with pytest.raises(ValueError, match="responses: " + said):
      scorer.score_dual(params, b.tokens, b.mask, b.tokens, b.mask, r, rmask,
                        config=cfg)
  toks = b.tokens.copy()
  toks[1, 0] = V + 5  # padding (mask 0)
  with pytest.raises(ValueError, match=rf"{V + 5} .* at padding positions"):
    sampler.sample(params, toks, b.mask, jax.random.key(0), **kw)


def test_the_vocabulary_check_inside_a_callers_trace():
  # Inside a caller's jit, eval_shape or grad, ids that are tracers are let
  # through (no ConcretizationTypeError), while concrete ids are still read
  # and refused, whatever the masks are.
  cfg, params = _plus_one_model()
  b = sampler.pad_left([[5, 6, 7], [10]], buckets=(4,))
  kw = dict(config=cfg, max_new_tokens=3)
  resp = np.array([[8, 9, 0], [11, 12, 13]], np.int32)
  rmask = np.array([[1, 1, 0], [1, 1, 1]], np.int32)
  key = jax.random.key(0)
  bad = b.tokens.copy()
  bad[1, 3] = V
  said = rf"token id\(s\) {V} outside the model's vocabulary"
  want = sampler.sample(params, b.tokens, b.mask, key, **kw).tokens
  lp = scorer.score(params, b.tokens, b.mask, resp, rmask, config=cfg)
  # Concrete ids, traced masks: checked, and good ids give the eager result.
  got = jax.jit(lambda m: sampler.sample(params, b.tokens, m, key,
                                         **kw).tokens)(b.mask)
  np.testing.assert_array_equal(got, want)
  got = jax.jit(lambda m, rm: scorer.score_dual(
      params, b.tokens, m, b.tokens, m, resp, rm, config=cfg))(b.mask, rmask)
  np.testing.assert_allclose(got[0], lp, atol=1e-5)
  np.testing.assert_allclose(got[1], lp, atol=1e-5)
  with pytest.raises(ValueError, match="prompts: " + said):
    jax.jit(lambda m: sampler.sample(params, bad, m, key, **kw).tokens)(
        b.mask)
  with pytest.raises(ValueError, match="prompts: " + said):
    jax.jit(lambda m, rm: scorer.score(params, bad, m, resp, rm,
                                       config=cfg))(b.mask, rmask)
  with pytest.raises(ValueError, match="prompts_b: " + said):
    jax.jit(lambda m, rm: scorer.score_dual(
        params, b.tokens, m, bad, m, resp, rm, config=cfg))(b.mask, rmask)
  with pytest.raises(ValueError, match="prompts: " + said):
    jax.grad(lambda p: scorer.score(p, bad, b.mask, resp, rmask,
                                    config=cfg).sum())(params)
  # Traced ids: let through, as when the trainer jits around the scorer.
  got = jax.jit(lambda *a: scorer.score_dual(params, *a, config=cfg))(
      b.tokens, b.mask, b.tokens, b.mask, resp, rmask)
  np.testing.assert_allclose(got[0], lp, atol=1e-5)
  # Shapes only (aot): eval_shape traces through the checked functions, and
  # `lower` is the unchecked jitted function's.
  spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
  out = jax.eval_shape(lambda t, m: sampler.sample(params, t, m, key, **kw),
                       spec(b.tokens), spec(b.mask))
  assert out.tokens.shape == (2, 3) and out.logprobs.dtype == jnp.float32
  out = jax.eval_shape(lambda *a: scorer.score_dual(params, *a, config=cfg),
                       *map(spec, (b.tokens, b.mask, b.tokens, b.mask, resp,
                                   rmask)))
  assert [o.shape for o in out] == [(2, 3), (2, 3)]
  assert scorer.score.lower(params, *map(spec, (b.tokens, b.mask, resp,
                                                rmask)), config=cfg)


class _TextVocab:
  """A tokenizer stand-in: token i's text is TEXTS[i]."""

  def __init__(self, texts):
    self.texts = texts

  def get_vocab(self):
    return {f"t{i}": i for i in range(len(self.texts))}

  def convert_tokens_to_string(self, tokens):
    return "".join(self.texts[int(t[1:])] for t in tokens)


STOP_TEXTS = ["</", "action", ">", ">.", " </", "look", "<", "/action>",
              "x", "</action>\n", "a", "<</", ""]


def _first_stop(table, rows):
  """Index of the token at which each row's matchers fire (-1: never)."""
  rows = np.asarray(rows, np.int32)
  step = jax.jit(sampler._match_step)  # pylint: disable=protected-access
  matched = jnp.zeros((rows.shape[0], table.shape[0]), jnp.int32)
  first = np.full(rows.shape[0], -1)
  for t in range(rows.shape[1]):
    matched, hit = step(jnp.asarray(table), matched, jnp.asarray(rows[:, t]))
    first = np.where((first < 0) & np.asarray(hit), t, first)
  return first


def test_stop_strings_end_rows_however_tokens_split_them():
  table = sampler.stop_string_table(_TextVocab(STOP_TEXTS), ["</action>"],
                                    vocab_size=len(STOP_TEXTS) + 1)
  assert table.shape == (1, 9, len(STOP_TEXTS) + 1)
  cases = {(5, 0, 1, 2): 3,  # look </ action >
           (5, 4, 1, 3): 3,  # look " </" action ">."
           (6, 7, 8, 8): 1,  # < /action>
           (9, 8, 8, 8): 0,  # one token holds it
           (11, 1, 2, 8): 2,  # "<</" action >: the matcher falls back
           (0, 1, 8, 2): -1,  # </actionx>
           (0, 10, 8, 2): -1,  # </ax>
           (13, 0, 1, 2): 3,  # an id the tokenizer lacks reads as no text
           (0, 12, 1, 2): 3,  # so does a token with no text, mid-string
           (0, 13, 1, 2): 3}
  got = _first_stop(table, list(cases))
  np.testing.assert_array_equal(got, list(cases.values()))
  assert sampler.stop_string_table(_TextVocab(STOP_TEXTS), [], 5) is None


def test_stop_table_agrees_with_the_decoded_text():
  rng = np.random.default_rng(0)
  strings = ["</action>", "aa<"]
  table = sampler.stop_string_table(_TextVocab(STOP_TEXTS), strings,
                                    vocab_size=len(STOP_TEXTS))
  rows = rng.integers(0, len(STOP_TEXTS), size=(300, 8))
  rows[:100, 2:6] = [0, 1, 2, 8]  # make sure many rows stop
  want = []
  for row in rows:
    text, at = "", -1
    for t, tok in enumerate(row):
      text += STOP_TEXTS[tok]
      if any(s in text for s in strings):
        at = t
        break
    want.append(at)
  np.testing.assert_array_equal(_first_stop(table, rows), want)


def test_sampler_stops_on_a_string_split_across_tokens():
  cfg, params = _plus_one_model()
  texts = [f"<{i}>" for i in range(V)]
  texts[6], texts[7], texts[8] = " </", "action", ">."
  table = sampler.stop_string_table(_TextVocab(texts), ["</action>"], V)
  batch = sampler.pad_left([[5], [6], [20]], buckets=(2,))
  out = sampler.sample(params, batch.tokens, batch.mask, jax.random.key(0),
                       config=cfg, max_new_tokens=6, stop_table=table,
                       pad_id=0)
  np.testing.assert_array_equal(out.tokens, [[6, 7, 8, 0, 0, 0],
                                             [7, 8, 9, 10, 11, 12],
                                             [21, 22, 23, 24, 25, 26]])
  np.testing.assert_array_equal(out.lengths, [3, 6, 6])
  np.testing.assert_array_equal(out.done, [True, False, False])


def test_special_tokens_read_as_no_text_as_replies_are_decoded():
  tok = tokenizer_lib.train_tokenizer(
      ["<think>go</think><action>look</action> a b"] * 5, vocab_size=300)
  user = tok.convert_tokens_to_ids(tokenizer_lib.USER)
  enc = lambda text: tok.encode(text, add_special_tokens=False)
  split = enc("</act") + [user] + enc("ion>") + enc("a")
  assert tok.decode(split, skip_special_tokens=True) == "</action>a"
  # It stops on "ion>", where the decoded text shows "</action>".
  table = sampler.stop_string_table(tok, ["</action>"], len(tok))
  np.testing.assert_array_equal(_first_stop(table, [split]),
                                [len(enc("</act")) + len(enc("ion>"))])
  # "user" is in the special token's own text only, not in the reply's.
  inside = enc("look") + [user] + enc(" a b")
  assert tok.decode(inside, skip_special_tokens=True) == "look a b"
  table = sampler.stop_string_table(tok, ["user"], len(tok))
  np.testing.assert_array_equal(_first_stop(table, [inside]), [-1])
