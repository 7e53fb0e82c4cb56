r"""Where a skill moves the policy: the skill-minus-plain gap per token kind.

  python -m seed_jax.gaps --workdir=RUN [--step=0] [--batches=2] [--seed=0] \
      [--analyzer=self] [--out_json=PATH]

Plays `--batches` rollout batches with the run's RL settings (from the
config.gin its training wrote) and the policy of update `--step` (0, the
default: the policy RL started from, RUN/policy; otherwise the checkpoint),
lets that policy analyze its own episodes greedily as a SEED update does
(`--analyzer=rules`: the rule-based annotator writes the skills instead, as
the run's `trainer.RLConfig.rule_detail` says, an oracle that reads where
things really were, to tell a policy that does not use skills from one whose
skills are wrong), scores every analyzed sample
under the ordinary and the skill-augmented prompt, and splits the per-token
gap skill_logp - old_logp by token kind and by the episode's outcome.
Kinds (`token_kinds`):
  "reasoning place": the place named after "Try " in the reasoning (with
    `search_hint`, as in demo_follow.gin, the demo's replies name the place
    they search there; without it, as in demo.gin, this kind is empty);
  "action place": the object of a "go to" action;
  "other action": the rest of the text inside <action> </action>;
  "other": reasoning, tags and everything else.
The same gap is also split by the step's phase (`step_phases`): "before
take", the steps before the episode's first valid "take" (in the household
game, the search for the object), and "from take", that step and the rest
(carrying out the task). A hindsight workflow names the place a success found
its object, so it can lower that success's earlier searches elsewhere and
still raise the steps that carried the task out: the phases tell the two
apart. And it is split by what the step's action was (`step_validity`):
"valid", "invalid", or "invalid repeat" (an invalid try of the step before's
action, a policy stuck on one invalid action). The OPD gate of a token is
sigmoid(beta * gap), so only tokens with a positive gap are pulled up more
than average.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import os
import re
import sys
from typing import Any, Sequence

import numpy as np

from seed_jax import atomic
from seed_jax.envs import household

KINDS = ("reasoning place", "action place", "other action", "other")
_WORD = re.compile(r"\w")
_TAG = re.compile(r"</?(?:think|action)>")


def token_kinds(pieces: Sequence[str]) -> list[str]:
  """The kind (see the module docstring) of each decoded response token.

  Example: ["<think>", "Try", " cabinet", " 3", ".", "</think>", "<action>",
  "go", " to", " cabinet", " 3", "</action>"] -> "other" x 2, "reasoning
  place" x 2, "other" x 4, "other action" x 2, "action place" x 2, "other".
  """
  # A tag a tokenizer splits ("</", "action", ">") is "other" in every piece.
  tags = [m.span() for m in _TAG.finditer("".join(pieces))]
  kinds, text = [], ""
  for piece in pieces:
    start = len(text)
    end = start + len(piece)
    if any(a < end and start < b for a, b in tags):
      kinds.append("other")
      text += piece
      continue
    opened, closed = text.rfind("<action>"), text.rfind("</action>")
    in_action = opened >= 0 and closed < opened and "<" not in piece
    in_think = text.rfind("</think>") < 0 and opened < 0
    tried = text.rfind("Try")
    if in_action:
      act = text[opened + len("<action>"):start].strip()
      place = act.startswith("go to") and _WORD.search(piece)
      kinds.append("action place" if place else "other action")
    elif (in_think and tried >= 0 and "." not in text[tried:start]
          and _WORD.search(piece) and "<" not in piece):
      kinds.append("reasoning place")
    else:
      kinds.append("other")
    text += piece
  return kinds


PHASES = ("before take", "from take")


def step_phases(steps: Sequence[Any]) -> list[str]:
  """The phase of each step of an episode (`episodes.Step`s): "before take"
  up to its first valid action that starts with "take ", "from take" from
  that step on (every step is "before take" in an episode that took nothing).

  Example: actions "go to cabinet 1", "take mug 1 from cabinet 1" (valid),
  "go to sinkbasin 1" -> "before take", "from take", "from take".
  """
  first = household.search_end([(st.action, st.action_valid)
                                for st in steps])
  return [PHASES[i >= first] for i in range(len(steps))]


VALIDITY = ("valid", "invalid", "invalid repeat")


def step_validity(steps: Sequence[Any]) -> list[str]:
  """What each step of an episode (`episodes.Step`s) did: "valid", "invalid
  repeat" when its reply tried the action of the step before
  (`household.repeated_tries`), else "invalid".

  Example: "go to cabinet 1" (valid), then replies trying "go to cabinet 1"
  twice (invalid: the policy stands there) -> "valid", "invalid repeat",
  "invalid repeat".
  """
  tried = household.tried_steps(steps)
  return [VALIDITY[0] if valid else VALIDITY[2] if repeat else VALIDITY[1]
          for (_, valid), repeat in zip(tried, household.repeated_tries(tried))]


def gap_table(rows: Sequence[tuple[Sequence[str], np.ndarray, bool]], *,
              beta: float) -> dict[str, dict[str, float]]:
  """Statistics of the gap per (kind, outcome).

  Args:
    rows: one (kinds [L], gap [L], episode succeeded) per analyzed sample.
    beta: the OPD gate's sharpness.

  Returns:
    {"<kind>/<success|failure>": {"tokens", "mean_gap", "above_0.5",
     "below_-0.5", "mean_gate"}}, only for cells with tokens.
  """
  cells: dict[str, list[float]] = collections.defaultdict(list)
  for kinds, gap, success in rows:
    for kind, g in zip(kinds, np.asarray(gap, np.float64)):
      cells[f"{kind}/{'success' if success else 'failure'}"].append(g)
  out = {}
  for key in sorted(cells):
    g = np.asarray(cells[key])
    out[key] = {"tokens": float(g.size), "mean_gap": float(g.mean()),
                "above_0.5": float(np.mean(g > 0.5)),
                "below_-0.5": float(np.mean(g < -0.5)),
                "mean_gate": float(np.mean(1 / (1 + np.exp(-beta * g))))}
  return out


def breakdown(rl_trainer, params, rng, *, batches: int,
              update_offset: int = 1000) -> dict[str, Any]:
  """Rolls out, analyzes and scores `batches` batches; `gap_table`s by token
  kind ("cells"), by step phase ("phases", see `step_phases`) and by what
  the step's action was ("validity", see `step_validity`), with the number
  of episodes played, of them won, and of task groups.

  `rl_trainer.rl` must analyze (variant "seed" or "opid") and have
  kl_coef = 0: no reference pass is made.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if not rl_trainer.rl.analyzes or rl_trainer.rl.kl_coef:
    raise ValueError("gaps need a trainer whose RL config analyzes and has "
                     f"kl_coef=0, got variant={rl_trainer.rl.variant!r}, "
                     f"kl_coef={rl_trainer.rl.kl_coef}")
  state = rl_trainer.create_state(params)
  rows, by_phase, by_validity, parsed, played = [], [], [], [], []
  for b in range(batches):
    c = rl_trainer.collect(state.params, jax.random.fold_in(rng, b),
                           update_index=update_offset + b)
    batch, _ = rl_trainer.build_batch(state, None, c)
    parsed.append(c.metrics.get("analyses_parsed", 0.0))
    decode = rl_trainer.tokenizer.decode
    phases = [step_phases(ep.steps) for ep in c.episodes]  # traj_uid order
    validity = [step_validity(ep.steps) for ep in c.episodes]
    played += [((b, ep.uid), ep.success) for ep in c.episodes]
    for i, s in enumerate(c.samples):
      if not batch["analyzed"][i]:
        continue
      n = len(s.response_ids)
      gap = batch["skill_logp"][i, :n] - batch["old_logp"][i, :n]
      kinds = token_kinds([decode([t]) for t in s.response_ids])
      ep = c.episodes[s.traj_uid]
      rows.append((kinds, gap, bool(ep.success)))
      by_phase.append(([phases[s.traj_uid][s.step]] * n, gap,
                       bool(ep.success)))
      by_validity.append(([validity[s.traj_uid][s.step]] * n, gap,
                          bool(ep.success)))
    logging.info("gaps: batch %d/%d, %d analyzed samples so far", b + 1,
                 batches, len(rows))
  # A few groups' tasks decide how many episodes were won: say how many.
  return {"batches": batches, "episodes": len(played),
          "won_episodes": sum(bool(won) for _, won in played),
          "groups": len({group for group, _ in played}),
          "analyzed_samples": len(rows),
          "analyses_parsed": float(np.mean(parsed)) if parsed else 0.0,
          "cells": gap_table(rows, beta=rl_trainer.rl.opd_beta),
          "phases": gap_table(by_phase, beta=rl_trainer.rl.opd_beta),
          "validity": gap_table(by_validity, beta=rl_trainer.rl.opd_beta)}


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="a run's workdir")
  parser.add_argument("--step", type=int, default=0,
                      help="the update whose policy is measured (0: the "
                      "policy RL started from)")
  parser.add_argument("--batches", type=int, default=2)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--analyzer", choices=("self", "rules"), default="self",
                      help="who writes the skills: the policy (greedily, as "
                      "in a SEED update) or the rule-based annotator")
  parser.add_argument("--out_json", default=None,
                      help="default WORKDIR/gaps.json (gaps_step_N.json "
                      "for --step=N > 0; gaps_rules*.json for "
                      "--analyzer=rules)")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  if args.batches < 1:
    raise SystemExit(f"error: --batches must be >= 1, got {args.batches}")
  import jax  # pylint: disable=g-import-not-at-top
  from seed_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from seed_jax import evaluate  # pylint: disable=g-import-not-at-top
  from seed_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  from seed_jax import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  train_lib.console_logging()
  workdir = os.path.abspath(args.workdir)
  name = "gaps" + ("_rules" if args.analyzer == "rules" else "")
  out = args.out_json or os.path.join(
      workdir, f"{name}_step_{args.step}.json" if args.step else f"{name}.json")
  try:
    evaluate.check_writable(out, what="the report")  # before any work
    run = evaluate.run_settings(workdir)
    config, tokenizer = evaluate.load_policy(
        workdir, run["policy_fn"], seed=evaluate.policy_seed(run))
    # A SEED update's analysis and scoring, whatever the run's variant; no
    # reference pass. The run's optimizer: its state is restored too.
    rl = dataclasses.replace(run["rl"], variant="seed", kl_coef=0.0,
                             analyzer=args.analyzer)
    rl_trainer = trainer_lib.RLTrainer(
        config, tokenizer, rl, env_name=run["env_name"],
        env_kwargs=run["env_kwargs"], tx=evaluate.run_optimizer(run))
    folder = os.path.join(workdir, "policy")
    if args.step == 0 and os.path.exists(os.path.join(folder,
                                                      "config.json")):
      from seed_jax import hf  # pylint: disable=g-import-not-at-top
      params = hf.load_pretrained(folder)[1]
    else:
      params = evaluate.restore_params(workdir, rl_trainer, args.step)
  except (checkpoints.CorruptCheckpointError, FileNotFoundError,
          ValueError) as e:
    raise SystemExit(f"error: {e}") from e
  except KeyError as e:  # a tensor missing from the policy folder
    raise SystemExit(f"error: {e.args[0]}") from e
  report = breakdown(rl_trainer, params, jax.random.key(args.seed),
                     batches=args.batches)
  report.update(workdir=workdir, step=args.step, seed=args.seed,
                analyzer=args.analyzer)
  print(f"{'kind, phase or step/outcome':30s} {'tokens':>7s} "
        f"{'mean gap':>9s} {'> 0.5':>6s} {'< -0.5':>7s} {'gate':>6s}")
  for key, c in [*report["cells"].items(), *report["phases"].items(),
                 *report["validity"].items()]:
    print(f"{key:30s} {c['tokens']:7.0f} {c['mean_gap']:+9.3f} "
          f"{c['above_0.5']:6.2f} {c['below_-0.5']:7.2f} "
          f"{c['mean_gate']:6.3f}")
  try:
    atomic.write_text(out, json.dumps(report, indent=1))
  except OSError as e:
    raise SystemExit(f"error: could not write the report: {e}") from e
  print(f"{report['episodes']} episodes of {report['groups']} task groups, "
        f"{report['won_episodes']} won; {report['analyzed_samples']} "
        "analyzed samples "
        f"(analyses parsed {report['analyses_parsed']:.2f}); wrote {out}")
  return report


if __name__ == "__main__":
  main()
