"""Scorer: dual call against two single calls and a naive full-logits reference."""

import jax
import numpy as np

from seed_jax import model as model_lib
from seed_jax import sampler
from seed_jax import scorer
from seed_jax import testing


def _batch(rng, lengths, bucket, vocab=128):
  return sampler.pad_left([list(rng.integers(3, vocab, n)) for n in lengths],
                          buckets=(bucket,))


def _naive(params, cfg, prompt, resp):
  """log p(resp | prompt) from the full logits of one unpadded sequence."""
  seq = np.asarray([list(prompt) + list(resp)], np.int32)
  lg = model_lib.apply(params, seq, np.ones_like(seq), config=cfg)[0]
  lsm = np.asarray(jax.nn.log_softmax(lg, axis=-1))
  P = len(prompt)
  return np.asarray([lsm[P - 1 + j, t] for j, t in enumerate(resp)])


def test_dual_equals_two_singles_and_naive():
  cfg = testing.tiny_config(family="qwen2")
  params = model_lib.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  a = _batch(rng, [5, 9, 3], 12)  # ordinary prompts
  b = _batch(rng, [14, 17, 11], 20)  # longer, skill-augmented prompts
  lens = [6, 2, 9]
  resp = np.zeros((3, 10), np.int32)
  rmask = np.zeros((3, 10), np.int32)
  for i, n in enumerate(lens):
    resp[i, :n] = rng.integers(3, 128, n)
    rmask[i, :n] = 1
  la, lb = scorer.score_dual(params, a.tokens, a.mask, b.tokens, b.mask, resp,
                             rmask, config=cfg, chunk=4)
  sa = scorer.score(params, a.tokens, a.mask, resp, rmask, config=cfg, chunk=4)
  sb = scorer.score(params, b.tokens, b.mask, resp, rmask, config=cfg, chunk=4)
  assert np.abs(np.asarray(la) - np.asarray(sa)).max() <= 1e-5
  assert np.abs(np.asarray(lb) - np.asarray(sb)).max() <= 1e-5
  for i, n in enumerate(lens):
    for p, lp in ((a, la), (b, lb)):
      prompt = p.tokens[i][p.mask[i].astype(bool)]
      ref = _naive(params, cfg, prompt, resp[i, :n])
      np.testing.assert_allclose(np.asarray(lp)[i, :n], ref, atol=1e-5)
  assert (np.asarray(la)[rmask == 0] == 0).all()
  # The skill context really changes the scores.
  assert np.abs(np.asarray(la) - np.asarray(lb)).max() > 1e-3


def test_chunk_size_does_not_matter():
  cfg = testing.tiny_config()
  params = model_lib.init_params(cfg, jax.random.key(1))
  rng = np.random.default_rng(1)
  p = _batch(rng, [4, 7], 8)
  resp = rng.integers(3, 128, (2, 13)).astype(np.int32)
  rmask = np.ones_like(resp)
  outs = [np.asarray(scorer.score(params, p.tokens, p.mask, resp, rmask,
                                  config=cfg, chunk=c)) for c in (1, 5, 13, 64)]
  for o in outs[1:]:
    np.testing.assert_allclose(o, outs[0], atol=1e-6)


def test_entropy_matches_full_softmax():
  cfg = testing.tiny_config(family="qwen3")
  params = model_lib.init_params(cfg, jax.random.key(2))
  rng = np.random.default_rng(2)
  p = _batch(rng, [6], 8)
  resp = rng.integers(3, 128, (1, 5)).astype(np.int32)
  rmask = np.ones_like(resp)
  lp, ent = jax.jit(lambda *a: scorer.score_tokens(
      *a, config=cfg, chunk=2, with_entropy=True))(
          params, p.tokens, p.mask, resp, rmask)
  seq = np.concatenate([p.tokens[:, 2:], resp], axis=1)
  lg = model_lib.apply(params, seq, np.ones_like(seq), config=cfg)
  lsm = np.asarray(jax.nn.log_softmax(lg[0, 5:10], axis=-1))
  ref_ent = -(np.exp(lsm) * lsm).sum(-1)
  np.testing.assert_allclose(np.asarray(ent)[0], ref_ent, atol=1e-5)


def test_a_temperature_scores_softmax_of_logits_over_it():
  cfg = testing.tiny_config(family="llama")
  params = model_lib.init_params(cfg, jax.random.key(3))
  rng = np.random.default_rng(3)
  a = _batch(rng, [5, 7], 8)
  b = _batch(rng, [11, 9], 12)
  resp = rng.integers(3, 128, (2, 6)).astype(np.int32)
  rmask = np.ones_like(resp)
  rmask[1, 4:] = 0
  T = 0.6
  lp, ent = jax.jit(lambda *x: scorer.score_tokens(
      *x, config=cfg, chunk=4, with_entropy=True, temperature=T))(
          params, a.tokens, a.mask, resp, rmask)
  la, lb = scorer.score_dual(params, a.tokens, a.mask, b.tokens, b.mask, resp,
                             rmask, config=cfg, chunk=4, temperature=T)
  sb = scorer.score(params, b.tokens, b.mask, resp, rmask, config=cfg,
                    chunk=4, temperature=T)
  np.testing.assert_allclose(np.asarray(la), np.asarray(lp), atol=1e-5)
  np.testing.assert_allclose(np.asarray(lb), np.asarray(sb), atol=1e-5)
  for i, n in enumerate(rmask.sum(1)):
    prompt = a.tokens[i][a.mask[i].astype(bool)]
    seq = np.asarray([list(prompt) + list(resp[i, :n])], np.int32)
    lg = model_lib.apply(params, seq, np.ones_like(seq), config=cfg)[0]
    lsm = np.asarray(jax.nn.log_softmax(lg / T, axis=-1))[len(prompt) - 1:-1]
    np.testing.assert_allclose(np.asarray(lp)[i, :n],
                               lsm[np.arange(n), resp[i, :n]], atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent)[i, :n],
                               -(np.exp(lsm) * lsm).sum(-1), atol=1e-5)
  one = scorer.score(params, a.tokens, a.mask, resp, rmask, config=cfg,
                     chunk=4)
  assert np.abs(np.asarray(one) - np.asarray(lp)).max() > 1e-2
