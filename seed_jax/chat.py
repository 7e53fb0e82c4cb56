"""Chat with a policy: a generation demo on SmolLM2-135M-Instruct (offline).

  python -m seed_jax.chat "Give me three tips for learning to cook."
  python -m seed_jax.chat --model_dir=/path/to/hf_folder "Hello"
"""

from __future__ import annotations

import argparse
import time

import jax

from seed_jax import hf
from seed_jax import rollout
from seed_jax import sampler


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("prompts", nargs="*",
                      default=["What is reinforcement learning? Answer in "
                               "two sentences."])
  parser.add_argument("--model_dir", default=None,
                      help="a Hugging Face folder; default: the SmolLM2 GGUF")
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--temperature", type=float, default=0.0,
                      help="0 for greedy decoding")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  if args.max_new_tokens < 1:
    parser.error(f"--max_new_tokens must be at least 1, got "
                 f"{args.max_new_tokens}")
  if not args.temperature >= 0 or args.temperature == float("inf"):
    parser.error(f"--temperature must be a number >= 0 (0: greedy), got "
                 f"{args.temperature}")

  t0 = time.time()
  try:
    # The tokenizer first: a folder it cannot serve fails before the weights
    # load.
    tok = hf.load_tokenizer(args.model_dir or None)
    if not tok.chat_template:  # a base model's tokenizer, say
      raise ValueError(
          f"the tokenizer of {args.model_dir or 'the SmolLM2 GGUF'} has no "
          "chat template, and this demo sends chat turns: use an instruct "
          "(chat) model")
    if args.model_dir:
      hf.check_vocab(tok, hf.load_config(args.model_dir))
      config, params = hf.load_pretrained(args.model_dir)
    else:
      config, params = hf.load_gguf()
    hf.check_vocab(tok, config)
  except (FileNotFoundError, KeyError, ValueError) as e:
    raise SystemExit(f"error: {e}") from None
  print(f"loaded {config.family} ({config.num_layers} layers) in "
        f"{time.time() - t0:.1f}s", flush=True)
  # The date rollouts give templates that print one (Llama 3.x): the same
  # prompt as in training, whatever the day.
  texts = [tok.apply_chat_template([{"role": "user", "content": p}],
                                   tokenize=False, add_generation_prompt=True,
                                   date_string=rollout.CHAT_DATE_STRING)
           for p in args.prompts]
  method = sampler.at_temperature(args.temperature)
  t0 = time.time()
  try:  # a prompt or budget past the model's context, say
    replies = sampler.generate_text(params, config, tok, texts,
                                    max_new_tokens=args.max_new_tokens,
                                    sampling=method,
                                    rng=jax.random.key(args.seed))
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  for p, r in zip(args.prompts, replies):
    print(f"\n>>> {p}\n{r.strip()}")
  print(f"\n(generated in {time.time() - t0:.1f}s, compilation included)")


if __name__ == "__main__":
  main()
