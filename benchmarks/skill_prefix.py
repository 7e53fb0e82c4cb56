"""How much of a dual-context call could be shared: the skill block's prefix.

Usage: python benchmarks/skill_prefix.py [--tasks 16] [--history 2,5]
         [--response-len 64] [--out PATH]

The ordinary and the skill-augmented prompt of a sample agree on their tokens
up to the skill block (inserted after the task line, docs/algorithm.md §5);
every later token attends to the block, so its states differ. An exact dual
call can therefore skip at most the shared prefix of the second context. For
household prompts (the first observation, then a repeated history step, as
the prompt of step 7) in SmolLM2-135M-Instruct's chat template, this prints
the mean token counts and the bound
  dual / two singles >= 1 - prefix / (ordinary + augmented + 2 * response)
counted in tokens (attention would make the saving smaller still).
"""

from __future__ import annotations

import argparse
import json
import os

from seed_jax import atomic  # jax-free: the XLA flags are set later

SKILL = ("Search the countertops and the dining table first; take the mug as "
         "soon as you see it, clean it in the sinkbasin, then put it in the "
         "coffeemachine.")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tasks", type=int, default=16)
  parser.add_argument("--history", default="2,5",
                      help="history lengths k, comma-separated")
  parser.add_argument("--response-len", type=int, default=64)
  parser.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "results",
      "skill_prefix.json"))
  args = parser.parse_args()
  for name in ('tasks', 'response_len'):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be at least 1, "
                   f"got {getattr(args, name)}")
  import numpy as np  # pylint: disable=g-import-not-at-top
  from seed_jax import hf  # pylint: disable=g-import-not-at-top
  from seed_jax import prompts  # pylint: disable=g-import-not-at-top
  from seed_jax import skills  # pylint: disable=g-import-not-at-top
  from seed_jax.envs import base  # pylint: disable=g-import-not-at-top

  tok = hf.load_tokenizer()

  def encode(prompt: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                   tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)

  pool = base.EnvPool("household", num_groups=args.tasks, group_size=1)
  observations, infos = pool.reset(list(range(args.tasks)))
  rows = []
  for k in [int(h) for h in args.history.split(",") if h]:
    a_len, b_len, shared = [], [], []
    for env, obs, info in zip(pool.members, observations, infos):
      history = [(obs, "go to countertop 1")] * 6
      prompt = prompts.build_prompt("household", env.task, history, obs,
                                    info["admissible_actions"],
                                    history_length=k)
      a = encode(prompt)
      b = encode(skills.build_skill_prompt(prompt, SKILL))
      n = 0
      while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
      a_len.append(len(a))
      b_len.append(len(b))
      shared.append(n)
    la, lb, pre = (float(np.mean(x)) for x in (a_len, b_len, shared))
    bound = 1 - pre / (la + lb + 2 * args.response_len)
    rows.append(dict(history=k, ordinary_tokens=la, augmented_tokens=lb,
                     shared_prefix_tokens=pre, best_dual_over_singles=bound))
    print(f"history {k}: ordinary {la:.0f} tokens, augmented {lb:.0f}, "
          f"shared prefix {pre:.0f}: dual / two singles >= {bound:.3f}")
  # The output's name only: results name no machine's folders.
  meta = dict(vars(args), out=os.path.basename(args.out))
  atomic.write_text(args.out, json.dumps(
      dict(benchmark="skill_prefix", args=meta, rows=rows), indent=1))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
