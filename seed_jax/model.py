"""One Flax (nnx) causal decoder for the Llama, Qwen2 and Qwen3 families.

The parameters live in an `nnx.Module` (`Decoder`) whose every `nnx.Param`
carries logical axis names (`axes=`); the computation is a pure function of a
plain parameter dict (`forward`, `logits`), so that samplers, scorers and train
steps can jit it with explicit shardings. Layers are stacked on a leading
`layers` axis and run with `lax.scan`: one compiled block whatever the depth
(except a decode step over a KV cache, which unrolls them: see
`_forward_cached`).

Parameter tree (shapes for L layers, D hidden, H heads, K kv heads, E head
dim, F mlp, V vocab):

  embed/embedding   [V, D]          (vocab, embed)
  layers/attn_norm  [L, D]          (layers, embed)
  layers/q_kernel   [L, D, H, E]    (layers, embed, heads, head_dim)
  layers/k_kernel   [L, D, K, E]    (layers, embed, kv_heads, head_dim)
  layers/v_kernel   [L, D, K, E]
  layers/o_kernel   [L, H, E, D]    (layers, heads, head_dim, embed)
  layers/{q,k,v}_bias   (qwen2 and llama attention_bias)
  layers/o_bias     [L, D]          (llama attention_bias)
  layers/{q,k}_norm [L, E]          (qwen3)
  layers/mlp_norm   [L, D]
  layers/gate_kernel, up_kernel [L, D, F]  (layers, embed, mlp)
  layers/down_kernel [L, F, D]
  final_norm/scale  [D]
  lm_head/kernel    [D, V]          (untied only)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, Mapping

import flax
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

Params = dict[str, Any]

FAMILIES = ("llama", "qwen2", "qwen3")
# config.json keys with no default worth guessing: the weights' shapes.
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
          "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings")


def _is_int(v: Any) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


_REQUIRED_HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size",
                     "num_hidden_layers", "num_attention_heads")


def _layer_types(hf: Mapping[str, Any]) -> list[Any]:
  """Each layer's attention kind, as transformers' Qwen2Config and
  Qwen3Config derive it: an explicit `layer_types` list wins; otherwise,
  with `use_sliding_window` and a `sliding_window`, the layers from
  `max_window_layers` (28 by default) on slide and the ones before do not,
  so use_sliding_window=true with max_window_layers >= the depth slides
  nowhere. (LlamaConfig reads none of these fields: a llama config.json's
  are ignored, as transformers ignores them.)"""
  if hf.get("layer_types") is not None:
    return list(hf["layer_types"])
  window = (hf.get("sliding_window", 4096) if hf.get("use_sliding_window")
            else None)
  first = hf.get("max_window_layers")
  first = 28 if first is None else first
  return ["sliding_attention" if window is not None and i >= first
          else "full_attention" for i in range(hf["num_hidden_layers"])]


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 style frequency scaling of RoPE."""
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder hyper-parameters; hashable, so it can be a static jit argument."""
  family: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  tie_embeddings: bool = False
  attention_bias: bool = False  # bias on q/k/v projections
  o_bias: bool = False  # bias on the output projection (llama attention_bias)
  qk_norm: bool = False
  max_position_embeddings: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"  # compute dtype; matmuls accumulate in float32
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  # Queries per attention block outside the sampler's decode loop; 0 for
  # whole sequences (segments), None for 64 on CPU and 256 on accelerators
  # (`_query_blocks`).
  # How the model computes, not which model: not in config.json.
  attention_block: int | None = None

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(
          f"unsupported model family {self.family!r}; supported: {FAMILIES}")
    bad = [f"{k}={getattr(self, k)!r}" for k in _SIZES
           if not _is_int(getattr(self, k)) or getattr(self, k) < 1]
    if bad:
      raise ValueError(f"model sizes must be positive integers: "
                       f"{', '.join(bad)}")
    ids = {"bos_token_id": self.bos_token_id,
           "pad_token_id": self.pad_token_id,
           **{f"eos_token_id[{i}]": t for i, t in enumerate(self.eos_token_ids)}}
    bad = [f"{k}={t!r}" for k, t in ids.items()
           if t is not None and (not _is_int(t) or t < 0)]
    if bad:
      raise ValueError(f"token ids must be non-negative integers (a token's "
                       f"text is not its id): {', '.join(bad)}")
    # Plain ints: the config is written as JSON (config.json, checkpoints).
    for k in _SIZES + ("bos_token_id", "pad_token_id"):
      if isinstance(getattr(self, k), np.integer):
        object.__setattr__(self, k, int(getattr(self, k)))
    object.__setattr__(self, "eos_token_ids",
                       tuple(int(t) for t in self.eos_token_ids))
    if self.attention_block is not None and (
        not _is_int(self.attention_block) or self.attention_block < 0):
      raise ValueError(f"attention_block must be None or an integer >= 0, "
                       f"got {self.attention_block!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} is not a multiple of "
          f"num_kv_heads={self.num_kv_heads}")

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_hf(cls, hf: Mapping[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from a Hugging Face `config.json` dict.

    Raises:
      ValueError: for an architecture other than Llama, Qwen2 or Qwen3, a
        missing size (vocab_size, hidden_size, intermediate_size,
        num_hidden_layers, num_attention_heads), a size that is not a
        positive integer, a token id that is not an integer, or a feature
        this decoder does not implement (a layer with sliding-window
        attention, mlp bias, other RoPE types).
    """
    family = hf.get("model_type")
    if family not in FAMILIES:
      archs = hf.get("architectures")
      raise ValueError(
          f"unsupported architecture in config.json: model_type={family!r} "
          f"architectures={archs}; seed_jax supports {FAMILIES}")
    missing = [k for k in _REQUIRED_HF_KEYS if hf.get(k) is None]
    if missing:
      raise ValueError(f"config.json lacks {', '.join(missing)}, which a "
                       f"{family} model needs")
    bad = [f"{k}={hf[k]!r}" for k in _REQUIRED_HF_KEYS
           if not _is_int(hf[k]) or hf[k] < 1]
    if bad:  # before head_dim is derived from them
      raise ValueError(f"config.json's sizes must be positive integers: "
                       f"{', '.join(bad)}")
    kinds = _layer_types(hf) if family in ("qwen2", "qwen3") else []
    sliding = [i for i, t in enumerate(kinds) if t == "sliding_attention"]
    if sliding:
      raise ValueError("config.json asks for sliding-window attention, "
                       "which seed_jax does not implement (layers "
                       f"{sliding} of {len(kinds)})")
    other = sorted({str(t) for t in kinds} - {"full_attention",
                                              "sliding_attention"})
    if other:
      raise ValueError(f"config.json's layer_types ask for {other}, which "
                       "seed_jax does not implement")
    if hf.get("mlp_bias"):
      raise ValueError("config.json asks for mlp_bias, which seed_jax does "
                       "not implement")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
      raise ValueError(f"config.json asks for hidden_act={act!r}; seed_jax "
                       "implements only silu")
    if hf.get("rope_scaling"):
      # transformers takes a legacy rope_scaling in place of rope_parameters
      # (not merged into it); theta then comes from rope_scaling or the
      # top-level rope_theta, never from the replaced rope_parameters.
      rope = dict(hf["rope_scaling"])
    else:
      rope = dict(hf.get("rope_parameters") or {})
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
      missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor",
                             "original_max_position_embeddings")
                 if k not in rope]
      if missing:
        raise ValueError(f"config.json's llama3 rope scaling lacks {missing}")
      scaling = RopeScaling(
          factor=float(rope["factor"]),
          low_freq_factor=float(rope["low_freq_factor"]),
          high_freq_factor=float(rope["high_freq_factor"]),
          original_max_position_embeddings=int(
              rope["original_max_position_embeddings"]))
    elif rope_type not in ("default", None):
      raise ValueError(f"unsupported rope_type {rope_type!r} in config.json; "
                       "supported: default, llama3")
    heads = hf["num_attention_heads"]
    # transformers' Qwen3Config defaults head_dim to 128, not hidden / heads.
    head_dim = hf.get("head_dim")
    if head_dim is None:
      head_dim = 128 if family == "qwen3" else hf["hidden_size"] // heads
    eos = hf.get("eos_token_id")
    eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    attention_bias = bool(hf.get("attention_bias", False))
    pad = hf.get("pad_token_id")
    if _is_int(pad) and pad < 0:  # early Llama conversions say -1: none
      logging.warning("config.json's pad_token_id=%d is read as no pad token",
                      pad)
      pad = None
    kw = dict(
        family=family,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=(heads if hf.get("num_key_value_heads") is None
                      else hf["num_key_value_heads"]),
        head_dim=head_dim,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=scaling,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=attention_bias or family == "qwen2",
        o_bias=attention_bias and family != "qwen2",
        qk_norm=family == "qwen3",
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos,
        pad_token_id=pad,
    )
    kw.update(overrides)
    return cls(**kw)

  def to_hf(self) -> dict[str, Any]:
    """The Hugging Face `config.json` dict for this config.

    Raises:
      ValueError: biases or norms that the family's config.json cannot say
        (transformers would load such a folder as another model).
    """
    wrong = []
    if self.family == "qwen2" and (not self.attention_bias or self.o_bias):
      wrong.append("qwen2 has q/k/v biases and no output bias "
                   "(attention_bias=True, o_bias=False)")
    if self.family != "qwen2" and self.o_bias != self.attention_bias:
      wrong.append(f"{self.family}'s attention_bias covers q, k, v and o "
                   "alike (attention_bias == o_bias)")
    if self.qk_norm != (self.family == "qwen3"):
      wrong.append("q/k norms are Qwen3's and only Qwen3's "
                   f"(qk_norm={self.family == 'qwen3'})")
    if wrong:
      raise ValueError(f"this {self.family} config cannot be written as a "
                       f"Hugging Face config.json: {'; '.join(wrong)}")
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}[self.family]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
    legacy = {}
    if self.rope_scaling is not None:
      rope = {"rope_type": "llama3", "rope_theta": self.rope_theta,
              **dataclasses.asdict(self.rope_scaling)}
      # transformers before v5 reads rope_scaling (theta at the top level);
      # v5 takes it in place of rope_parameters, to the same effect.
      legacy = {"rope_scaling": {"rope_type": "llama3",
                                 **dataclasses.asdict(self.rope_scaling)}}
    out = {
        "architectures": [arch], "model_type": self.family,
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
        "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
        "rope_parameters": rope, **legacy,
        "tie_word_embeddings": self.tie_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "hidden_act": "silu", "torch_dtype": self.param_dtype,
        "bos_token_id": self.bos_token_id, "pad_token_id": self.pad_token_id,
        # None, not [], for no EOS: transformers' generate() takes an empty
        # list's first id (IndexError).
        "eos_token_id": (None if not self.eos_token_ids
                         else self.eos_token_ids[0]
                         if len(self.eos_token_ids) == 1
                         else list(self.eos_token_ids)),
    }
    if self.family in ("llama", "qwen3"):  # qwen2's q/k/v bias is implied
      out["attention_bias"] = self.o_bias
    if self.family == "llama":
      out["mlp_bias"] = False
    return out


# ---------------------------------------------------------------------------
# Parameters: an nnx module whose Params carry logical axis names.


class _Norm(nnx.Module):

  def __init__(self, shape, axes, dtype):
    self.scale = nnx.Param(jnp.ones(shape, dtype), axes=axes)


class _Layers(nnx.Module):
  """All decoder blocks, stacked on a leading `layers` axis."""

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    dt = jnp.dtype(c.param_dtype)
    L, D, H, K, E, F = (c.num_layers, c.hidden_size, c.num_heads,
                        c.num_kv_heads, c.head_dim, c.intermediate_size)

    def w(shape, axes, fan_in):
      init = jax.random.normal(rngs.params(), shape, jnp.float32)
      return nnx.Param((init / math.sqrt(fan_in)).astype(dt), axes=axes)

    def ones(shape, axes):
      return nnx.Param(jnp.ones(shape, dt), axes=axes)

    def zeros(shape, axes):
      return nnx.Param(jnp.zeros(shape, dt), axes=axes)

    self.attn_norm = ones((L, D), ("layers", "embed"))
    self.q_kernel = w((L, D, H, E), ("layers", "embed", "heads", "head_dim"), D)
    self.k_kernel = w((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim"), D)
    self.v_kernel = w((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim"), D)
    self.o_kernel = w((L, H, E, D), ("layers", "heads", "head_dim", "embed"), H * E)
    if c.attention_bias:
      self.q_bias = zeros((L, H, E), ("layers", "heads", "head_dim"))
      self.k_bias = zeros((L, K, E), ("layers", "kv_heads", "head_dim"))
      self.v_bias = zeros((L, K, E), ("layers", "kv_heads", "head_dim"))
    if c.o_bias:
      self.o_bias = zeros((L, D), ("layers", "embed"))
    if c.qk_norm:
      self.q_norm = ones((L, E), ("layers", "head_dim"))
      self.k_norm = ones((L, E), ("layers", "head_dim"))
    self.mlp_norm = ones((L, D), ("layers", "embed"))
    self.gate_kernel = w((L, D, F), ("layers", "embed", "mlp"), D)
    self.up_kernel = w((L, D, F), ("layers", "embed", "mlp"), D)
    self.down_kernel = w((L, F, D), ("layers", "mlp", "embed"), F)


class _Embed(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    init = jax.random.normal(rngs.params(), (c.vocab_size, c.hidden_size))
    self.embedding = nnx.Param(
        init.astype(c.param_dtype), axes=("vocab", "embed"))


class _Head(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    init = jax.random.normal(rngs.params(), (c.hidden_size, c.vocab_size))
    self.kernel = nnx.Param(
        (init / math.sqrt(c.hidden_size)).astype(c.param_dtype),
        axes=("embed", "vocab"))


class Decoder(nnx.Module):
  """The decoder's parameters (`forward` and `logits` compute with them)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = _Embed(config, rngs)
    self.layers = _Layers(config, rngs)
    self.final_norm = _Norm((config.hidden_size,), ("embed",),
                            jnp.dtype(config.param_dtype))
    if not config.tie_embeddings:
      self.lm_head = _Head(config, rngs)


def init_params(config: ModelConfig, rng: jax.Array) -> Params:
  """Random parameters as a plain dict (see the module docstring)."""
  model = Decoder(config, rngs=nnx.Rngs(params=rng))
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def logical_axes(config: ModelConfig) -> Params:
  """Logical axis names of every parameter, same tree as `init_params`."""
  abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(params=0)))
  state = nnx.state(abstract, nnx.Param)
  names = jax.tree.map(lambda v: v.get_metadata()["axes"], state,
                       is_leaf=lambda x: isinstance(x, nnx.Variable))
  return nnx.to_pure_dict(names)


def param_shapes(config: ModelConfig) -> Params:
  """`jax.ShapeDtypeStruct` of every parameter, without allocating any."""
  return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


# ---------------------------------------------------------------------------
# The computation: pure functions of the parameter dict.


def _dot(eq: str, x: jax.Array, w: jax.Array, dtype) -> jax.Array:
  # Accumulate in float32 even for bfloat16 inputs: both more accurate and,
  # on CPU, several times faster than a bfloat16-accumulating dot.
  return jnp.einsum(eq, x, w.astype(dtype),
                    preferred_element_type=jnp.float32).astype(dtype)


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * x32.astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """[E/2] inverse frequencies, llama3 scaling applied where configured."""
  dim = config.head_dim
  inv = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
  inv = inv.astype(np.float32)
  s = config.rope_scaling
  if s is None:
    return inv
  old = s.original_max_position_embeddings
  low_wavelen = old / s.low_freq_factor
  high_wavelen = old / s.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
  smooth = (old / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates the two halves of the last axis (the Hugging Face layout).

  x: [B, T, N, E]; cos, sin: [B, T, E/2] float32.
  """
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  c, s = cos[:, :, None, :], sin[:, :, None, :]
  out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
  return out.astype(x.dtype)


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """[B, T] positions counting only real tokens (left padding gets 0)."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def _to_bits(x: jax.Array) -> jax.Array:
  # XLA:CPU has no 16-bit float dynamic-slice or dynamic-update-slice: it
  # rewrites them in float32 over the whole operand (every stacked weight, or
  # the whole cache on each write). Their bit patterns as uint16 slice and
  # update in place, and bitcasting back costs at most one copy.
  if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize == 2:
    return jax.lax.bitcast_convert_type(x, jnp.uint16)
  return x


def _from_bits(x: jax.Array, dtype) -> jax.Array:
  if x.dtype == jnp.uint16 and jnp.dtype(dtype) != jnp.uint16:
    return jax.lax.bitcast_convert_type(x, dtype)
  return x


@flax.struct.dataclass
class Cache:
  """A KV cache (`init_cache`); `forward` reads and writes it.

  One buffer per layer rather than one stacked array: a layer's slice of a
  stacked cache is copied out on every read (XLA:CPU), which doubled the
  time of a decode step.
  """
  k: tuple[jax.Array, ...]  # L x [B, K, E, S], keys transposed for q @ k
  v: tuple[jax.Array, ...]  # L x [B, K, S, E]
  # The dtype of the keys and values. A 16-bit float cache (the default on
  # accelerators; the sampler keeps a float32 one on CPU, where 16 bits are
  # slower) is stored as its uint16 bit patterns (see `_to_bits`).
  dtype: str = flax.struct.field(pytree_node=False, default="float32")


def init_cache(config: ModelConfig, batch: int, length: int,
               dtype=None) -> Cache:
  """An empty KV cache for `batch` rows of `length` slots."""
  c = config
  dt = jnp.dtype(dtype or c.dtype)

  def zeros(shape):
    return tuple(_to_bits(jnp.zeros(shape, dt)) for _ in range(c.num_layers))
  return Cache(k=zeros((batch, c.num_kv_heads, c.head_dim, length)),
               v=zeros((batch, c.num_kv_heads, length, c.head_dim)),
               dtype=dt.name)


def _qkv(x, p, cos, sin, c: ModelConfig, dt):
  """Pre-norm q [B, T, H, E] and k, v [B, T, K, E], RoPE applied."""
  h = _rms_norm(x, p["attn_norm"], c.rms_norm_eps)
  q = _dot("btd,dhe->bthe", h, p["q_kernel"], dt)
  k = _dot("btd,dke->btke", h, p["k_kernel"], dt)
  v = _dot("btd,dke->btke", h, p["v_kernel"], dt)
  if c.attention_bias:
    q = q + p["q_bias"].astype(dt)
    k = k + p["k_bias"].astype(dt)
    v = v + p["v_bias"].astype(dt)
  if c.qk_norm:
    q = _rms_norm(q, p["q_norm"], c.rms_norm_eps)
    k = _rms_norm(k, p["k_norm"], c.rms_norm_eps)
  return _rope(q, cos, sin), _rope(k, cos, sin), v


def _out_and_mlp(x, o, p, c: ModelConfig, dt):
  """Residual output projection [B, T, H, E] -> [B, T, D], then the MLP."""
  o = _dot("bthe,hed->btd", o, p["o_kernel"], dt)
  if c.o_bias:
    o = o + p["o_bias"].astype(dt)
  x = x + o
  h = _rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
  g = _dot("btd,df->btf", h, p["gate_kernel"], dt)
  u = _dot("btd,df->btf", h, p["up_kernel"], dt)
  return x + _dot("btf,fd->btd", jax.nn.silu(g) * u, p["down_kernel"], dt)


def _query_blocks(start: int, end: int, size: int | None = None
                  ) -> list[tuple[int, int]]:
  """Causal attention in blocks of queries: [start, end) -> [(b0, b1)].

  A block attends only to keys before its end, which skips most of the
  masked half of the scores and keeps each block's scores in cache: on CPU,
  a 256-token prefill's attention runs 3x faster in blocks of 64 than whole.
  At most 16 blocks, so that long sequences do not unroll into many. On an
  accelerator each block is a few more kernel launches per layer, which cost
  more than the masked half saves, so blocks are larger there: on an H200,
  blocks of 256 made SmolLM2-135M's scoring 4% to 12% faster than blocks of
  64 at batch 16 and were within 2% of one block; at batch 64 they were 3%
  to 6% faster than one block and up to 5% slower than 64 (see the README's
  speed paragraph). They also bound the [B, H, block, T] scores of long
  sequences.

  Args:
    size: queries per block (`ModelConfig.attention_block`); 0 for one
      block; None for 64 on CPU and 256 on other backends.
  """
  if size is None:
    size = 64 if jax.default_backend() == "cpu" else 256
  if size == 0:
    return [(start, end)]
  size = max(size, -(-(end - start) // 16))
  return [(b, min(b + size, end)) for b in range(start, end, size)]


def _mask_bias(kv_mask, first_slot, q0: int, q1: int, s0: int, s1: int
               ) -> jax.Array:
  """[B, q1 - q0, s1 - s0] float32 attention bias of queries [q0, q1) over
  key slots [s0, s1): 0 where the key is a real token at or before the
  query's slot (`first_slot` + query index), -1e30 elsewhere.

  Built per query block where it is used, not once for [B, T, S]: that
  array was a large share of a long scoring call's memory (145 of 424 MB
  for 8 rows of 2176 tokens). Inside the layer scan it is rebuilt per layer,
  a few elementwise ops beside the block's matmuls (measured: no slower).
  """
  q_slot = first_slot + jnp.arange(q0, q1)
  allowed = jnp.arange(s0, s1)[None, :] <= q_slot[:, None]  # [t, s]
  allowed = allowed[None] & kv_mask[:, None, s0:s1].astype(bool)
  return jnp.where(allowed, 0.0, -1e30).astype(jnp.float32)


def _attend_cached(q, k_all, v_all, bias, c: ModelConfig):
  """Attention of q [B, T, H, E] over keys [B, K, E, S], values [B, K, S, E].

  Keys and values are float32; bias is [B, T, S]. Two plain batched matmuls
  over (batch, kv head), the query group and time as rows: the einsum form
  (keys [B, S, K, E]) is lowered on CPU to a generic dot several times
  slower at T = 1.
  """
  B, T, _, E = q.shape
  K, G, S = c.num_kv_heads, c.num_heads // c.num_kv_heads, k_all.shape[3]
  qg = q.astype(jnp.float32).reshape(B, T, K, G, E).transpose(0, 2, 3, 1, 4)
  qg = qg.reshape(B, K, G * T, E)
  batch = ((0, 1), (0, 1))
  att = jax.lax.dot_general(qg, k_all, (((3,), (2,)), batch))  # [B,K,GT,S]
  att = att.reshape(B, K, G, T, S) * c.head_dim ** -0.5 + bias[:, None, None]
  att = jax.nn.softmax(att, axis=-1).reshape(B, K, G * T, S)
  o = jax.lax.dot_general(att, v_all, (((3,), (2,)), batch))  # [B,K,GT,E]
  o = o.reshape(B, K, G, T, E).transpose(0, 3, 1, 2, 4)
  return o.reshape(B, T, K * G, E).astype(q.dtype)


def forward(params: Params, tokens: jax.Array, positions: jax.Array,
            kv_mask: jax.Array, *, config: ModelConfig,
            cache: Cache | None = None, cache_index: jax.Array | int = 0,
            remat: bool = False, segments: tuple[int, ...] | None = None,
            ) -> tuple[jax.Array, Cache | None]:
  """Runs the decoder blocks.

  Without a cache, `tokens` attend causally among themselves, or, with
  `segments`, within their own segment only: several sequences packed on the
  T axis share every dense layer and none of the attention. With a cache,
  their keys/values are written at slots [cache_index, cache_index + T) of
  every row and the queries attend to all earlier valid slots (only to the
  first cache_index + T slots when `cache_index` is a Python int, as in a
  prefill), in float32 whatever the cache dtype.

  Args:
    params: the parameter dict.
    tokens: [B, T] int32 token ids.
    positions: [B, T] int32 RoPE positions.
    kv_mask: [B, S] bool, which key slots hold real tokens (S = T without a
      cache, the cache length with one).
    config: the model config (static).
    cache: optional KV cache from `init_cache`.
    cache_index: scalar slot of tokens[:, 0] in the cache.
    remat: rematerialize each block in the backward pass.
    segments: static lengths, summing to T, of independent sequences packed
      on the T axis (not with a cache); `positions` count within each.

  Returns:
    hidden: [B, T, D] final-normed hidden states (compute dtype).
    cache: the updated cache (None when none was given).
  """
  c = config
  dt = jnp.dtype(c.dtype)
  B, T = tokens.shape
  x = jnp.take(params["embed"]["embedding"], tokens, axis=0).astype(dt)
  inv = jnp.asarray(rope_inv_freq(c))
  ang = positions.astype(jnp.float32)[..., None] * inv  # [B, T, E/2]
  cos, sin = jnp.cos(ang), jnp.sin(ang)
  G = c.num_heads // c.num_kv_heads
  scale = c.head_dim ** -0.5

  if cache is not None:
    if segments is not None:
      raise ValueError("segments do not combine with a cache")
    return _forward_cached(params, x, cos, sin, kv_mask, c, cache,
                           cache_index)
  segments = tuple(segments or (T,))
  if sum(segments) != T:
    raise ValueError(f"segments {segments} do not sum to T={T}")
  bounds = np.cumsum((0,) + segments)
  # (queries, first key): each query block of a segment attends to the keys
  # from the segment's start to the block's end.
  blocks = [(b0, b1, s0) for s0, s1 in zip(bounds[:-1], bounds[1:])
            for b0, b1 in _query_blocks(s0, s1, c.attention_block)]

  def attend(q, k, v, bias):
    t = q.shape[1]
    q = q.reshape(B, t, c.num_kv_heads, G, c.head_dim)
    att = jnp.einsum("btkge,bske->bkgts", q, k,
                     preferred_element_type=jnp.float32) * scale
    att = att + bias[:, None, None]
    att = jax.nn.softmax(att, axis=-1).astype(dt)
    o = jnp.einsum("bkgts,bske->btkge", att, v,
                   preferred_element_type=jnp.float32).astype(dt)
    return o.reshape(B, t, c.num_heads, c.head_dim)

  def block(x, p):
    q, k, v = _qkv(x, p, cos, sin, c, dt)
    o = [attend(q[:, b0:b1], k[:, s0:b1], v[:, s0:b1],
                _mask_bias(kv_mask, cache_index, b0, b1, s0, b1))
         for b0, b1, s0 in blocks]
    o = o[0] if len(o) == 1 else jnp.concatenate(o, axis=1)
    return _out_and_mlp(x, o, p, c, dt), None

  if remat:
    block = jax.checkpoint(block)
  x, _ = jax.lax.scan(block, x, params["layers"])
  x = _rms_norm(x, params["final_norm"]["scale"], c.rms_norm_eps)
  return x, None


def unstack_layers(layers: Params) -> tuple[Params, ...]:
  """Stacked block weights ({name: [L, ...]}) -> L per-layer dicts."""
  n = jax.tree.leaves(layers)[0].shape[0]
  return tuple(jax.tree.map(lambda a, i=i: a[i], layers) for i in range(n))


def _forward_cached(params, x, cos, sin, kv_mask, c: ModelConfig,
                    cache: Cache, cache_index) -> tuple[jax.Array, Cache]:
  """The blocks of `forward` with a KV cache (inference only)."""
  dt = jnp.dtype(c.dtype)
  kv_dt = jnp.dtype(cache.dtype)
  T = x.shape[1]

  def new_kv(k, v):
    # [B, T, K, E] -> keys [B, K, E, T] and values [B, K, T, E], rounded to
    # the cache dtype, so that a prefill sees what later steps will read.
    return (k.astype(kv_dt).transpose(0, 2, 3, 1),
            v.astype(kv_dt).transpose(0, 2, 1, 3))

  def write(buf, new, axis):
    at = [0] * buf.ndim
    at[axis] = cache_index
    return jax.lax.dynamic_update_slice(buf, _to_bits(new), at)

  if isinstance(cache_index, int) and cache_index == 0:
    # A prefill: the tokens attend only among themselves, so one scanned
    # block serves every layer, and the keys/values go into the cache after.
    dtypes = jax.tree.map(lambda a: a.dtype, params["layers"])

    def block(x, bits):
      p = jax.tree.map(_from_bits, bits, dtypes)
      q, k, v = _qkv(x, p, cos, sin, c, dt)
      k, v = new_kv(k, v)
      k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)
      o = [_attend_cached(q[:, b0:b1], k32[..., :b1], v32[:, :, :b1],
                          _mask_bias(kv_mask, 0, b0, b1, 0, b1), c)
           for b0, b1 in _query_blocks(0, T, c.attention_block)]
      o = o[0] if len(o) == 1 else jnp.concatenate(o, axis=1)
      return _out_and_mlp(x, o, p, c, dt), (_to_bits(k), _to_bits(v))

    layers = jax.tree.map(_to_bits, params["layers"])
    x, (ks, vs) = jax.lax.scan(block, x, layers)
    ks = tuple(jax.lax.dynamic_update_slice_in_dim(buf, ks[i], 0, axis=3)
               for i, buf in enumerate(cache.k))
    vs = tuple(jax.lax.dynamic_update_slice_in_dim(buf, vs[i], 0, axis=2)
               for i, buf in enumerate(cache.v))
  else:
    # Decoding: the layers are unrolled over their own cache buffers, which
    # are updated in place and read without a copy. `layers` may come
    # unstacked (`unstack_layers`, as the sampler passes them): slices of the
    # stacked weights taken here, inside the sampler's loop, are copied again
    # on every step by XLA:CPU in float32.
    hi = (cache_index + T if isinstance(cache_index, int)
          else kv_mask.shape[1])
    bias = _mask_bias(kv_mask, cache_index, 0, T, 0, hi)
    ks, vs = list(cache.k), list(cache.v)
    layers = params["layers"]
    if not isinstance(layers, (list, tuple)):
      layers = unstack_layers(layers)
    for i in range(c.num_layers):
      p = layers[i]
      q, k, v = _qkv(x, p, cos, sin, c, dt)
      k, v = new_kv(k, v)
      ks[i], vs[i] = write(ks[i], k, 3), write(vs[i], v, 2)
      k_all = _from_bits(ks[i][..., :hi], kv_dt).astype(jnp.float32)
      v_all = _from_bits(vs[i][:, :, :hi], kv_dt).astype(jnp.float32)
      o = _attend_cached(q, k_all, v_all, bias, c)
      x = _out_and_mlp(x, o, p, c, dt)
    ks, vs = tuple(ks), tuple(vs)
  x = _rms_norm(x, params["final_norm"]["scale"], c.rms_norm_eps)
  return x, cache.replace(k=ks, v=vs)


def logits(params: Params, hidden: jax.Array, *,
           config: ModelConfig) -> jax.Array:
  """[B, T, D] hidden -> [B, T, V] float32 logits."""
  if config.tie_embeddings:
    w = params["embed"]["embedding"]
    return jnp.einsum("btd,vd->btv", hidden, w.astype(hidden.dtype),
                      preferred_element_type=jnp.float32)
  w = params["lm_head"]["kernel"]
  return jnp.einsum("btd,dv->btv", hidden, w.astype(hidden.dtype),
                    preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("config",))
def apply(params: Params, tokens: jax.Array, mask: jax.Array, *,
          config: ModelConfig) -> jax.Array:
  """Full-sequence logits [B, T, V] for left-padded tokens and mask [B, T]."""
  hidden, _ = forward(params, tokens, positions_from_mask(mask), mask,
                      config=config)
  return logits(params, hidden, config=config)
