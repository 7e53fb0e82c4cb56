"""Steps per second of each built-in environment under its expert.

Usage: python benchmarks/env_speed.py [--episodes 500]

Prints two rates per environment: env.step alone, and whole episodes (reset,
expert planning and steps). Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import time

from seed_jax import envs


def measure(name: str, episodes: int, **kwargs) -> tuple[float, float, float]:
  """Runs `episodes` expert episodes on train seeds.

  Returns:
    (env.step calls per second, steps per second including reset and the
    expert, success rate).
  """
  env = envs.make(name, **kwargs)
  step_time, steps, wins = 0.0, 0, 0
  start = time.perf_counter()
  for seed in envs.split_seeds("train", episodes):
    env.reset(seed)
    expert = envs.make_expert(env)
    done = False
    while not done:
      action = expert.act()
      t = time.perf_counter()
      _, _, done, info = env.step(action)
      step_time += time.perf_counter() - t
      steps += 1
    wins += info["won"]
  total = time.perf_counter() - start
  return steps / step_time, steps / total, wins / episodes


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--episodes", type=int, default=500)
  args = parser.parse_args()
  for name in ('episodes',):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be at least 1, "
                   f"got {getattr(args, name)}")
  for name, kwargs in (("household", {}), ("sokoban", {}),
                       ("sokoban", {"dim": (8, 8), "num_boxes": 2})):
    step_rate, episode_rate, success = measure(name, args.episodes, **kwargs)
    label = name + (f" {kwargs}" if kwargs else "")
    print(f"{label:40s} step: {step_rate:9.0f}/s   with reset+expert: "
          f"{episode_rate:8.0f}/s   expert success: {success:.0%}")


if __name__ == "__main__":
  main()
