"""Stage 2: one SEED / GRPO update (evaluation: `evaluate.evaluate_split`).

An update (docs/algorithm.md §3): roll out B groups x N with theta_old ->
sample scores and GRPO advantages -> self-analysis with the same weights
(greedy) -> skill-augmented prompts -> ordinary and augmented contexts scored
in one dual call (old and skill log-probs) and the reference log-probs ->
mini-batched train steps on the combined loss.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
import optax

from seed_jax import advantages as adv_lib
from seed_jax import annotators
from seed_jax import checkpoints
from seed_jax import distributed
from seed_jax import envs
from seed_jax import episodes as episodes_lib
from seed_jax import faults
from seed_jax import metrics as metrics_lib
from seed_jax import model as model_lib
from seed_jax import partitioning
from seed_jax import prompts as prompts_lib
from seed_jax import rl_checks
from seed_jax import rollout as rollout_lib
from seed_jax import sampler as sampler_lib
from seed_jax import scorer
from seed_jax import skills
from seed_jax import train_step as ts
from seed_jax.envs import base as envs_base

VARIANTS = ("grpo", "seed", "opid")
TRAIN_KEYS = ("prompts", "prompt_mask", "responses", "response_mask",
              "old_logp", "ref_logp", "skill_logp", "advantages", "analyzed")
ANALYZERS = ("self", "external", "rules")
# Why a self-analysis gave no skill, counted per update as
# "analyses_failed/<reason>" (prompt_too_long: "analysis_prompts_too_long").
SELF_ANALYSIS_FAILURES = ("truncated", "no_json", "missing_skill",
                          "empty_skill")
# Per-chunk shares -> the per-chunk count each is a share of: over chunks a
# share is averaged weighted by that count (summed itself), not summed.
RATES = {"analyses_parsed": "analyses_asked",
         "analyses_truncated": "analyses_sampled"}


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Knobs of one RL update (the paper's values: docs/algorithm.md §7).

  variant: "grpo" (no analysis, no distillation), "seed" (gated OPD loss) or
    "opid" (skill log-prob shift added to the advantage, no OPD loss).
  analyzer: "self" (the policy analyzes, greedily), "external" (a teacher)
    or "rules" (`annotators.RuleTeacher`, games in `annotators.ENVS`: an oracle
    ablation, since the rules read what the agent never saw).
  rule_detail: how analyzer="rules" says where things were, one of
    `annotators.DETAILS` ("kind": household only); the other analyzers
    ignore it.
  rule_repeats: analyzer="rules" ends a skill with
    `annotators.REPEAT_RULE` when its episode has a repeated try (as
    Stage1Config.rule_repeats teaches the policy to); others ignore it.
  analysis_mode: "episode_only", or "episode_step": the analysis also names
    at most `max_critical_steps` critical steps, and a sample at such a step
    is re-scored with the critical-step block after the episode block.
  opid_center: variant "opid" centres each analyzed row's skill shift on
    its mean over the row's response tokens before adding it
    (`advantages.opid_shaping`'s mask); off is the paper's shaping.
  step_advantage_weight: GiGPO's w: each sample's advantage gains w times its
    step advantage (`advantages.gigpo_step_advantage` over the discounted
    step rewards, gamma `step_gamma`, normalized as `adv_norm`); 0 is off.
  invalid_action: what the environment is sent for a reply whose action
    parsed but is not admissible (`prompts.INVALID_ACTIONS`): "no_op" (the
    environment's no-op; the history shows it) or "as_written" (the action
    itself: the household game answers "Nothing happens." and the history
    shows what was tried, as in verl-agent's ALFWorld). Evaluations of the
    run play the same way.
  temperature: the rollouts' sampling temperature (the paper's is 1.0). The
    policy RL trains is softmax(logits / temperature): the old, skill-
    augmented, reference and current log-probs are all scored at it, so PPO's
    ratios and the distillation term describe the policy that sampled.
  """
  variant: str = "seed"
  analyzer: str = "self"
  rule_detail: str = "place"
  rule_repeats: bool = False
  num_groups: int = 16  # B
  group_size: int = 8  # N
  max_steps: int = 30
  history_length: int = 2
  invalid_action: str = "no_op"
  temperature: float = 1.0
  max_new_tokens: int = 64  # response budget per turn
  analysis_max_new_tokens: int = 160
  analysis_mode: str = "episode_only"
  # The analysis prompt's budgets, in characters and in tokens (None: the
  # largest prompt bucket); Stage 1's must be the same (Stage1Config's
  # max_prompt_chars and max_prompt_tokens) for byte-identical prompts.
  analysis_max_chars: int | None = None
  analysis_max_prompt_tokens: int | None = None
  max_critical_steps: int = 3
  prompt_buckets: tuple[int, ...] = (128, 256, 384, 512, 768, 1024, 2048)
  mini_batch_size: int = 32  # rows per optimizer step
  micro_batches: int = 1
  ppo_epochs: int = 1
  adv_norm: str = "mean_std_norm"
  adv_stats_over: str = "samples"
  invalid_penalty: float = 0.1
  opid_weight: float = 0.001
  opid_center: bool = False
  step_advantage_weight: float = 0.0
  step_gamma: float = 0.95
  opd_coef: float = 0.01
  opd_beta: float = 5.0
  kl_coef: float = 0.01
  entropy_coef: float = 0.001
  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float = 3.0
  remat: bool = False

  def __post_init__(self):
    if self.micro_batches < 1 or self.mini_batch_size < 1:
      raise ValueError(f"mini_batch_size and micro_batches must be >= 1, got "
                       f"{self.mini_batch_size} and {self.micro_batches}")
    if self.adv_norm not in adv_lib.NORMS:
      raise ValueError(f"unknown adv_norm {self.adv_norm!r}; known: "
                       f"{adv_lib.NORMS}")
    if self.adv_stats_over not in adv_lib.STATS_OVER:
      raise ValueError(f"unknown adv_stats_over {self.adv_stats_over!r}; "
                       f"known: {adv_lib.STATS_OVER}")
    if self.mini_batch_size % self.micro_batches:
      raise ValueError(f"mini_batch_size={self.mini_batch_size} does not "
                       f"split into micro_batches={self.micro_batches}")
    if not self.temperature > 0:
      raise ValueError(f"RL samples its rollouts: temperature must be > 0, "
                       f"got {self.temperature}")
    if self.variant not in VARIANTS:
      raise ValueError(f"unknown variant {self.variant!r}; known: {VARIANTS}")
    if self.analyzer not in ANALYZERS:
      raise ValueError(f"unknown analyzer {self.analyzer!r}; known: "
                       f"{ANALYZERS}")
    annotators.check_detail(self.rule_detail, name="rule_detail")
    prompts_lib.check_invalid_action(self.invalid_action,
                                     name="RLConfig.invalid_action")
    if self.analysis_mode not in skills.MODES:
      raise ValueError(f"unknown analysis_mode {self.analysis_mode!r}; "
                       f"known: {skills.MODES}")
    if self.max_critical_steps < 1:
      raise ValueError(
          f"max_critical_steps must be >= 1, got {self.max_critical_steps}")
    if (self.analysis_max_prompt_tokens is not None
        and self.analysis_max_prompt_tokens > max(self.prompt_buckets)):
      raise ValueError(
          f"analysis_max_prompt_tokens={self.analysis_max_prompt_tokens} "
          f"exceeds the largest prompt bucket ({max(self.prompt_buckets)} of "
          f"prompt_buckets={tuple(self.prompt_buckets)})")
    if self.step_advantage_weight < 0 or not 0 <= self.step_gamma <= 1:
      raise ValueError(
          f"step_advantage_weight must be >= 0 and step_gamma in [0, 1], got "
          f"{self.step_advantage_weight} and {self.step_gamma}")

  @property
  def analyzes(self) -> bool:
    return self.variant in ("seed", "opid")

  @property
  def step_skills(self) -> int:
    """Critical-step skills asked of each analysis (0: none)."""
    return self.max_critical_steps if self.analysis_mode == "episode_step" else 0

  def loss_kwargs(self) -> dict[str, Any]:
    return dict(opd_coef=self.opd_coef if self.variant == "seed" else 0,
                opd_beta=self.opd_beta, kl_coef=self.kl_coef,
                entropy_coef=self.entropy_coef, clip_low=self.clip_low,
                clip_high=self.clip_high, dual_clip=self.dual_clip)


def _pad_rows(arrays: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Appends all-zero rows (masked out) up to a multiple of `multiple`."""
  n = next(iter(arrays.values())).shape[0]
  extra = -n % multiple
  if not extra:
    return arrays
  return {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)])
          for k, v in arrays.items()}


def merge_chunk_metrics(chunks: Sequence[Mapping[str, float]]
                        ) -> dict[str, float]:
  """One update's analysis metrics from its chunks': counts are summed, and
  each share in RATES is averaged weighted by the count it is a share of."""
  out = {}
  for key in (chunks[0] if chunks else {}):
    vals = [c[key] for c in chunks]
    if key in RATES:
      weights = [c[RATES[key]] for c in chunks]
      out[key] = float(np.average(vals, weights=weights)) if sum(weights) else 0.0
    else:
      out[key] = float(np.sum(vals))
  return out


def _in_chunks(fn: Callable[..., Any], arrays: Sequence[np.ndarray],
               rows: int) -> list[np.ndarray]:
  """Applies `fn` to row chunks of equal size (one compilation) and concats.

  Every chunk is dispatched before any result is fetched, so the device
  never waits on a host transfer between chunks.
  """
  n = arrays[0].shape[0]
  outs = jax.device_get([fn(*[a[start:start + rows] for a in arrays])
                         for start in range(0, n, rows)])
  if isinstance(outs[0], tuple):
    return [np.concatenate(parts) for parts in zip(*outs)]
  return [np.concatenate(outs)]


def _add_step_advantage(adv: np.ndarray, samples, rl: RLConfig
                        ) -> tuple[np.ndarray, dict[str, float]]:
  """GiGPO: A_i += w * A^S_i, steps grouped by (task group, raw observation).

  A step's reward is the environment's minus `invalid_penalty` for an
  invalid action; A^S_i normalizes its discounted return-to-go within its
  step group (`advantages.gigpo_step_advantage`). Samples of a trajectory
  are in step order, as `rollout.rollout` makes them.

  Returns:
    The new [S] advantages (S samples) and {"step_groups_shared": the
    share of samples whose step group has other members}.
  """
  rewards = np.asarray([s.reward - rl.invalid_penalty * (not s.action_valid)
                        for s in samples], np.float32)
  returns = adv_lib.discounted_returns(rewards, [s.traj_uid for s in samples],
                                       gamma=rl.step_gamma)
  uids = [s.uid for s in samples]
  observations = [s.observation for s in samples]
  step_adv = adv_lib.gigpo_step_advantage(returns, uids, observations,
                                          norm=rl.adv_norm)
  keys = list(zip(uids, observations))
  counts = collections.Counter(keys)
  shared = float(np.mean([counts[k] > 1 for k in keys])) if keys else 0.0
  return (adv + rl.step_advantage_weight * step_adv).astype(np.float32), {
      "step_groups_shared": shared}


@dataclasses.dataclass
class Collected:
  """What the rollout phase of an update hands to the learning phase."""
  samples: list[rollout_lib.Sample]  # of episodes whose env did not raise
  episodes: list[Any]  # Episode, indexed by traj_uid
  skills: dict[int, skills.Analysis]  # traj_uid -> parsed hindsight analysis
  metrics: dict[str, float]


class RLTrainer:
  """Runs SEED/GRPO updates for one policy on one environment.

  The train state and the reference live on a (data, fsdp, tensor) mesh (one
  device by default); the scorer and the train step are jitted with explicit
  shardings. Rollouts and self-analysis run in `rollout_chunks` independent
  chunks of task groups; each process plays its share of the chunks with a
  full copy of the weights on its first local device, and the samples are
  gathered on every process. Chunk c has its own rng, seeds and trajectory
  ids, so an update does not depend on how many processes share the work.

  Example (every process runs the same lines):

    rl_trainer = RLTrainer(config, tok, rl, env_name="household", tx=tx,
                           mesh=partitioning.make_mesh((-1, 1, 1)))
    state = rl_trainer.create_state(host_params)
    reference = rl_trainer.place_params(host_params)
    state, scalars = rl_trainer.update(state, reference, rng, update_index=0)
  """

  def __init__(self, model_config, tokenizer, rl: RLConfig, *, env_name: str,
               tx: optax.GradientTransformation, mesh=None,
               rollout_chunks: int | None = None, rules=None, env_kwargs=None,
               teacher=None):
    """Builds the policy wrapper, the environments and the jitted functions.

    Args:
      model_config, tokenizer: the policy's.
      rl: the update's knobs.
      env_name, env_kwargs: the training environment.
      tx: the optimizer.
      mesh: the mesh of the state and the train step (default: one device).
      rollout_chunks: independent rollout chunks per update (default: the
        process count); a multiple of the process count dividing
        `rl.num_groups`. Keep it fixed to compare runs on different hosts.
      rules: logical-to-mesh rules (default `partitioning.DEFAULT_RULES`).
      teacher: an OpenAI-compatible teacher for analyzer="external".

    Raises:
      ValueError: chunks that do not split the groups or the processes, a
        mini-batch that the data-parallel size does not divide, an
        external analyzer without a teacher, or prompt budgets that do not
        fit the model's context (`rl_checks.check_prompt_budgets`).
    """
    self.config = model_config
    self.tokenizer = tokenizer
    self.rl = rl
    self.tx = tx
    self.env_name = env_name
    self.env_kwargs = dict(env_kwargs or {})
    taken = sorted(set(self.env_kwargs) & {"num_groups", "group_size",
                                           "split", "max_steps"})
    if taken:
      raise ValueError(f"env_kwargs may not set {taken}: the RL config "
                       "and the evaluation set them")
    self.teacher = rl_checks.check_analyzer(rl, env_name, teacher)
    rules = rules or partitioning.DEFAULT_RULES
    self.mesh, self.chunks = rl_checks.check_layout(rl, mesh, rollout_chunks,
                                                    rules)
    self.policy = rollout_lib.Policy(
        model_config, tokenizer, max_new_tokens=rl.max_new_tokens,
        buckets=rl.prompt_buckets, min_rows=8,
        logprob_temperature=rl.temperature)
    # Analyses are JSON that only EOS ends: a rollout stop string inside a
    # skill ("... inside <action> </action>") would cut it unparseable.
    self.analyst = rollout_lib.Policy(
        model_config, tokenizer, max_new_tokens=rl.analysis_max_new_tokens,
        buckets=rl.prompt_buckets, min_rows=8, stop_strings=())
    self.analysis_max_tokens = rl_checks.check_prompt_budgets(
        rl, model_config.max_position_embeddings)
    self.pad_id = self.policy.pad_id
    self.pool = envs_base.EnvPool(
        env_name, num_groups=rl.num_groups // self.chunks,
        group_size=rl.group_size, split="train", max_steps=rl.max_steps,
        **self.env_kwargs)

    self.param_shardings = partitioning.param_shardings(model_config,
                                                        self.mesh, rules)
    self.state_shardings = ts.state_shardings(tx, self.param_shardings,
                                              self.mesh)
    rep = partitioning.replicated(self.mesh)
    self._rows = partitioning.batch_sharding(self.mesh, 1, rules)
    loss_fn = functools.partial(ts.rl_loss, config=model_config,
                                remat=rl.remat, temperature=rl.temperature,
                                **rl.loss_kwargs())
    step = ts.jit_train_step(
        tx, loss_fn, num_micro_batches=rl.micro_batches,
        state_shardings=self.state_shardings, batch_shardings=self._rows,
        metrics_sharding=rep)
    self.step_fn = lambda state, mb: step(state, self._global(mb))
    psh, rows = self.param_shardings, self._rows
    at = dict(config=model_config, temperature=rl.temperature)
    dual = jax.jit(lambda p, *a: scorer.score_dual(p, *a, **at),
                   in_shardings=(psh,) + (rows,) * 6, out_shardings=(rep, rep))
    single = jax.jit(lambda p, *a: scorer.score(p, *a, **at),
                     in_shardings=(psh,) + (rows,) * 4, out_shardings=rep)
    self._dual = lambda params, *a: dual(params, *self._global(a))
    self._single = lambda params, *a: single(params, *self._global(a))
    self._replicate = jax.jit(lambda p: p, out_shardings=rep)
    self._create = jax.jit(lambda p: ts.TrainState.create(p, tx),
                           out_shardings=self.state_shardings)
    # `copy`, not the identity: new buffers, never the input's (the state's
    # are donated each step, the reference's must outlive them).
    self._copy = jax.jit(lambda p: jax.tree.map(lambda x: x.copy(), p),
                         out_shardings=self.param_shardings)

  def _global(self, tree):
    return partitioning.host_to_global(
        tree, jax.tree.map(lambda _: self._rows, tree))

  # -- placement ------------------------------------------------------------

  def _on_mesh(self, params) -> bool:
    """Whether every leaf of `params` is a jax.Array on this mesh (sharded
    over it in any way) or, for a one-device mesh, on that device."""
    devices = set(self.mesh.devices.flat)

    def on(x):
      if not isinstance(x, jax.Array):
        return False
      if len(devices) == 1:
        return x.sharding.device_set == devices
      # This very mesh: a jitted copy wants its devices in the same order.
      return (isinstance(x.sharding, jax.sharding.NamedSharding)
              and x.sharding.mesh == self.mesh)

    leaves = jax.tree.leaves(params)
    return bool(leaves) and all(on(x) for x in leaves)

  def place_params(self, params) -> Any:
    """Params -> a copy on the mesh, sharded as `param_shardings`.

    Params already on the mesh (Stage 1 ran there, one process) are copied
    device to device, into new buffers; others (host arrays, or a process's
    own full copy, the same on every process) go through the host. The
    values and dtypes are the same either way.
    """
    if self._on_mesh(params):
      return self._copy(params)
    return partitioning.host_to_global(jax.device_get(params),
                                       self.param_shardings)

  def create_state(self, params) -> ts.TrainState:
    """A fresh TrainState on the mesh from a copy of `params` (see
    `place_params`: the caller's params are never donated)."""
    return self._create(self.place_params(params))

  def abstract_state(self) -> ts.TrainState:
    """The state as sharded ShapeDtypeStructs: the target of a restore."""
    return ts.abstract_state(self.tx, self.config, self.state_shardings)

  def check_stage1(self, stage1_report: dict[str, Any] | None) -> None:
    """Raises ValueError when the policy's Stage 1 was fine-tuned on other
    analysis prompts than this run's self-analysis writes; warns when the
    self-analysis may write fewer tokens than Stage 1's targets had.

    `stage1_report` is `Policy.report["stage1"]` (absent without Stage 1:
    no check; one saved before the report named its prompts or its
    `response_len_max` skips that check). Warns, too, when Stage 1's
    rollouts sent inadmissible actions otherwise than this run's do (a
    report that does not say sent the no-op): its analyses saw other
    histories.
    """
    rl, report = self.rl, stage1_report or {}
    if not rl.analyzes or rl.analyzer != "self":
      return
    played = report.get("invalid_action", "no_op")
    if report and played != rl.invalid_action:
      logging.warning(
          "Stage 1's rollouts sent inadmissible actions as %r, this run's "
          "as %r (RLConfig.invalid_action): the analyses it fine-tuned were "
          "written on other histories; bind Stage1Config.invalid_action "
          "alike", played, rl.invalid_action)
    longest = report.get("response_len_max")
    if longest and rl.analysis_max_new_tokens < longest:
      logging.warning(
          "RLConfig.analysis_max_new_tokens=%d is below the "
          "Stage1Config.response_len_max=%d that Stage 1 fine-tuned the "
          "policy's analyses to: analyses longer than %d tokens are cut and "
          "fail to parse (analyses_failed/truncated); raise "
          "analysis_max_new_tokens to %d", rl.analysis_max_new_tokens,
          longest, rl.analysis_max_new_tokens, longest)
    trained = report.get("analysis_prompt")
    if not trained:
      return
    ours = dict(mode=rl.analysis_mode, max_critical_steps=rl.max_critical_steps,
                max_chars=rl.analysis_max_chars,
                max_tokens=self.analysis_max_tokens)
    if rl.analysis_mode != "episode_step":  # K is not in the prompt
      trained = dict(trained, max_critical_steps=None)
      ours["max_critical_steps"] = None
    if dict(trained) != ours:
      raise ValueError(
          f"Stage 1 fine-tuned the policy on analysis prompts {trained}, but "
          f"this run's self-analysis would write {ours}; bind them alike "
          "(ANALYSIS_MODE, MAX_CRITICAL_STEPS, the character budgets and "
          "ANALYSIS_PROMPT_TOKENS)")

  def abstract_params(self) -> Any:
    return checkpoints.abstract_tree(model_lib.param_shapes(self.config),
                                     self.param_shardings)

  def local_params(self, params) -> Any:
    """A full copy of `params` on this process's first local device.

    A collective (every process calls it). Sampling runs on that copy, with
    no cross-host traffic per token.
    """
    full = self._replicate(params)
    return jax.tree.map(lambda x: x.addressable_data(0), full)

  # -- rollout phase ----------------------------------------------------------

  def _analyze(self, params, episodes, rng
               ) -> tuple[dict[int, skills.Analysis], dict]:
    """Self- or external analysis -> {traj_uid: analysis}, stats.

    Critical-step skills are kept only in "episode_step" mode, at most
    `max_critical_steps` per episode and only for steps the episode has.
    """
    stats = skills.ParseStats()
    found: dict[int, skills.Analysis] = {}
    k = self.rl.step_skills
    if self.rl.analyzer in ("external", "rules"):
      replies = self.teacher.annotate_many(episodes)
      for ep, rep in zip(episodes, replies):
        if isinstance(rep, Mapping) and rep.get("episode_skill"):
          # The teacher's dict is an analysis already; parsing its JSON
          # applies this run's step limits.
          parsed = skills.parse_analysis(json.dumps(rep), num_steps=ep.length,
                                         max_step_skills=k)
          if isinstance(parsed, skills.Analysis):
            found[ep.traj_uid] = parsed
      return found, {"analyses_parsed": len(found) / max(len(episodes), 1),
                     "analyses_asked": float(len(episodes))}
    # Fitting encodes each prompt; the sampler reuses those ids.
    encode = functools.lru_cache(maxsize=None)(self.analyst.encode)
    built = [skills.fit_analysis_prompt(
        ep, encode=encode, max_tokens=self.analysis_max_tokens,
        mode=self.rl.analysis_mode,
        max_critical_steps=self.rl.max_critical_steps,
        max_chars=self.rl.analysis_max_chars) for ep in episodes]
    gens = iter(self.analyst.generate_ids(
        params, [encode(b.text) for b in built if b is not None], rng,
        sampler_lib.Greedy()))
    cut = 0  # analyses that hit analysis_max_new_tokens
    for ep, b in zip(episodes, built):
      if b is None:
        stats.record(skills.ParseError("prompt_too_long"))
        continue
      out = next(gens)
      truncated = getattr(out, "truncated", False)  # a stand-in's 3-tuple
      cut += truncated
      parsed = stats.record(skills.parse_analysis(
          self.analyst.decode(out[1]), num_steps=ep.length,
          max_step_skills=k, truncated=truncated))
      if isinstance(parsed, skills.Analysis):
        found[ep.traj_uid] = parsed
    fitted = [b for b in built if b is not None]
    return found, {"analyses_parsed": stats.rate,
                   "analyses_asked": float(len(episodes)),
                   "analyses_truncated": cut / max(len(fitted), 1),
                   "analyses_sampled": float(len(fitted)),
                   "analysis_steps_cut": float(sum(b.steps_cut for b in fitted)),
                   "analysis_prompts_too_long": float(len(built) - len(fitted)),
                   **{f"analyses_failed/{r}": float(stats.reasons.get(r, 0))
                      for r in SELF_ANALYSIS_FAILURES}}

  def _play_chunk(self, params, chunk: int, rng_roll, rng_an,
                  update_index: int) -> dict[str, Any]:
    rl = self.rl
    groups = rl.num_groups // self.chunks
    start = update_index * rl.num_groups + chunk * groups
    seeds = envs_base.split_seeds("train", groups, start=start)
    gen = lambda prompts, r: self.policy.generate(
        params, prompts, r, sampler_lib.Temperature(rl.temperature))
    truncated = self.policy.prompts_truncated
    t = time.time()
    where = f"update {update_index + 1}, chunk {chunk + 1}/{self.chunks}"
    try:
      res = rollout_lib.rollout(
          gen, self.pool, jax.random.fold_in(rng_roll, chunk),
          env_name=self.env_name, max_steps=rl.max_steps,
          history_length=rl.history_length, group_seeds=seeds,
          uid_offset=start, invalid_action=rl.invalid_action)
    except rollout_lib.PromptTooLongError as e:
      # RL's policy never cuts a prompt (it would train on another
      # context): the remedies are RL's own knobs.
      raise rollout_lib.PromptTooLongError(
          f"{where}: {e.detail}", "RL never cuts prompts: raise "
          f"RLConfig.prompt_buckets (now {tuple(rl.prompt_buckets)}) or "
          f"shorten the prompts with RLConfig.history_length (now "
          f"{rl.history_length})",
          index=e.index, tokens=e.tokens, largest=e.largest) from None
    faults.maybe_crash("rollout", update_index)
    shift = chunk * groups * rl.group_size  # trajectory ids stay unique
    for s in res.samples:
      s.traj_uid += shift
    for e in res.episodes:
      e.traj_uid += shift
    rollout_time, t = time.time() - t, time.time()
    logging.info("%s: %d episodes (%d env steps) played in %.0f s", where,
                 len(res.episodes), res.env_steps, rollout_time)
    found, an = {}, {}
    if rl.analyzes:
      # An episode whose environment raised (at reset: no step at all) has
      # no outcome and no sample in the batch: no analysis is generated (or
      # paid for) for it.
      played = [e for e in res.episodes if e.length and e.error is None]
      found, an = self._analyze(params, played,
                                jax.random.fold_in(rng_an, chunk))
      faults.maybe_crash("analysis", update_index)
      logging.info("%s: %d of %d analyses parsed in %.0f s", where,
                   len(found), len(played), time.time() - t)
    return dict(res=res, found=found, an=an, rollout_time=rollout_time,
                analysis_time=time.time() - t,
                truncated=self.policy.prompts_truncated - truncated)

  def collect(self, params, rng: jax.Array, *, update_index: int) -> Collected:
    """Rollouts and analyses of every chunk, gathered on every process.

    The samples leave out the steps of episodes whose environment raised
    (`samples_env_error` counts them); the episodes keep them, failed.
    `responses_truncated` is the share of replies (those left out too) cut
    at `max_new_tokens`. The environment's `episode_stats` ratios over the
    episodes join the metrics (household: `search_usual`, where the searches
    in vain went, against chance, and `reached_goal_place`, `took_goal`,
    `won_after_take` and the like, how far the episodes got; see
    `evaluate.evaluate_split`).

    Raises:
      RuntimeError: a chunk failed on some process, or every episode's
        environment raised (no step to train on).
    """
    rng_roll, rng_an = jax.random.split(rng)
    local = self.local_params(params)
    mine = distributed.process_slice(range(self.chunks))
    failure = None
    try:
      parts = [self._play_chunk(local, c, rng_roll, rng_an, update_index)
               for c in mine]
    except Exception as e:  # pylint: disable=broad-except
      # Gathered like the results: the other processes must not wait for
      # chunks that will not come.
      parts, failure = [], e
    times = {"time/rollout": sum(p["rollout_time"] for p in parts),
             "time/analysis": sum(p["analysis_time"] for p in parts)}
    gathered = distributed.allgather_objects(
        (parts, None if failure is None
         else f"{type(failure).__name__}: {failure}"))
    if failure is not None:
      raise failure
    for proc, (_, error) in enumerate(gathered):
      if error is not None:
        raise RuntimeError(f"process {proc} failed in its rollout chunks: "
                           f"{error}")
    parts = [p for proc, _ in gathered for p in proc]
    episodes = [e for p in parts for e in p["res"].episodes]
    # The steps of an episode whose environment raised have no outcome to
    # be judged by: they are left out of the batch (counted), not trained
    # on as a failure's.
    broken = {e.traj_uid for e in episodes if e.error is not None}
    every = [s for p in parts for s in p["res"].samples]
    samples = [s for s in every if s.traj_uid not in broken]
    if not samples:
      errors = [e.error for e in episodes if e.error is not None]
      raise RuntimeError(
          f"update {update_index + 1}: no step to train on: "
          f"{len(errors)} of {len(episodes)} episodes' environments raised"
          + (f" (the first: {errors[0]})" if errors else ""))
    found = {k: v for p in parts for k, v in p["found"].items()}
    metrics = {"env_steps": float(sum(p["res"].env_steps for p in parts)),
               "samples_env_error": float(len(every) - len(samples)),
               "prompts_truncated": float(sum(p["truncated"] for p in parts)),
               "responses_truncated": float(np.mean([s.truncated
                                                     for s in every])),
               **times}  # this process's times
    metrics.update(merge_chunk_metrics([p["an"] for p in parts]))
    stats_fn = envs.episode_stats_fn(self.env_name)
    if stats_fn is not None:  # household: search and take statistics
      metrics.update(episodes_lib.sum_ratios(stats_fn(e) for e in episodes))
    return Collected(samples, episodes, found, metrics)

  # -- learning phase -------------------------------------------------------

  def build_batch(self, state, ref_params, c: Collected
                  ) -> tuple[dict, dict]:
    """Advantages, skill prompts and the three log-probs of every sample:
    the training batch of `update` and its metrics (`ref_params`, the KL
    reference, is read only when `kl_coef` is set). The token means
    `skill_logp_gap` (over analyzed rows), its parts over the rows of won and
    lost episodes (`skill_logp_gap_success`, `skill_logp_gap_failure`) and
    `logp_agreement` are left out of the metrics when they have no token to
    average."""
    self._check_reference(ref_params)
    rl, samples, episodes, found = self.rl, c.samples, c.episodes, c.skills
    returns = np.asarray([episodes[s.traj_uid].episode_return
                          for s in samples], np.float32)
    valid = np.asarray([s.action_valid for s in samples])
    scores = adv_lib.sample_scores(returns, valid,
                                   invalid_penalty=rl.invalid_penalty)
    gids, ng = adv_lib.dense_ids([s.uid for s in samples])
    tids, nt = adv_lib.dense_ids([s.traj_uid for s in samples])
    adv = np.asarray(adv_lib.grpo(scores, gids, tids, num_groups=ng,
                                  num_trajs=nt, norm=rl.adv_norm,
                                  stats_over=rl.adv_stats_over))
    step_metrics = {}
    if rl.step_advantage_weight:
      adv, step_metrics = _add_step_advantage(adv, samples, rl)
    arrays = rollout_lib.pad_samples(samples, pad_id=self.pad_id,
                                     prompt_buckets=self.policy.buckets,
                                     response_len=rl.max_new_tokens)
    # A skill that pushes its prompt past the largest bucket the model's
    # context holds (with a full response) leaves that row without
    # distillation (counted), like an analysis that does not parse.
    limit = max(self.policy.buckets)
    skill_ids, too_long, step_rows = [], 0, 0
    for s in samples:
      ids = s.prompt_ids
      if s.traj_uid in found:
        analysis = found[s.traj_uid]
        step_skill = analysis.step_skills.get(s.step + 1)  # 1-based steps
        ids = self.policy.encode(skills.build_skill_prompt(
            s.prompt, analysis.skill, step_skill=step_skill))
        if len(ids) > limit:
          ids, too_long = s.prompt_ids, too_long + 1
        else:
          step_rows += step_skill is not None
      skill_ids.append(ids)
    analyzed = np.asarray([s.traj_uid in found and ids is not s.prompt_ids
                           for s, ids in zip(samples, skill_ids)])
    sk = sampler_lib.pad_left(skill_ids, buckets=self.policy.buckets,
                              pad_id=self.pad_id)
    n = len(samples)
    batch = _pad_rows(dict(
        arrays, skill_prompts=sk.tokens, skill_mask=sk.mask,
        advantages=np.broadcast_to(
            adv[:, None], arrays["responses"].shape).astype(np.float32),
        analyzed=analyzed), rl.mini_batch_size)
    b = batch
    plain = (b["prompts"], b["prompt_mask"], b["responses"],
             b["response_mask"])
    if rl.analyzes:  # ordinary and skill-augmented contexts in one call
      old_logp, skill_logp = _in_chunks(
          functools.partial(self._dual, state.params),
          (b["prompts"], b["prompt_mask"], b["skill_prompts"], b["skill_mask"],
           b["responses"], b["response_mask"]), rl.mini_batch_size)
    else:
      (old_logp,) = _in_chunks(functools.partial(self._single, state.params),
                               plain, rl.mini_batch_size)
      skill_logp = old_logp
    ref_logp = old_logp
    if rl.kl_coef:
      (ref_logp,) = _in_chunks(functools.partial(self._single, ref_params),
                               plain, rl.mini_batch_size)
    if rl.variant == "opid":
      batch["advantages"] = np.asarray(adv_lib.opid_shaping(
          batch["advantages"], skill_logp, old_logp, batch["analyzed"],
          weight=rl.opid_weight,
          mask=batch["response_mask"] if rl.opid_center else None))
    batch.update(old_logp=old_logp, skill_logp=skill_logp, ref_logp=ref_logp)
    rmask = arrays["response_mask"].astype(bool)
    shift = skill_logp[:n] - old_logp[:n]
    scored = rmask & analyzed[:, None]
    won = np.asarray([episodes[s.traj_uid].success for s in samples],
                     bool)[:, None]
    diff = np.abs(old_logp[:n] - arrays["old_logp"])[rmask]
    # A mean over no token is left out, not 0: GRPO has no skill_logp_gap.
    # On the tokens of one context the shift's mean is -KL <= 0 whatever the
    # skill says; split by outcome, it shows whether hindsight skills raise
    # the actions of successes and lower those of failures.
    means = {name: float(x.mean()) for name, x in
             (("logp_agreement", diff), ("skill_logp_gap", shift[scored]),
              ("skill_logp_gap_success", shift[scored & won]),
              ("skill_logp_gap_failure", shift[scored & ~won])) if x.size}
    return batch, {
        **step_metrics,
        "skill_prompts_too_long": float(too_long),
        "step_skill_rows": float(step_rows),
        **means,
        "valid_action_ratio": float(valid.mean()) if n else 0.0}

  def _check_reference(self, ref_params) -> None:
    """Raises ValueError when the KL term needs a reference that is None."""
    if self.rl.kl_coef and ref_params is None:
      raise ValueError(
          f"RLConfig.kl_coef={self.rl.kl_coef} needs the KL reference "
          "parameters, but ref_params is None: pass the reference (e.g. "
          "place_params(initial params)) or set kl_coef=0")

  def _learn(self, state, batch, rng: jax.Array, *,
             update_index: int) -> tuple[Any, dict]:
    """Mini-batched optimizer steps over shuffled rows, ppo_epochs times."""
    rl = self.rl
    avg = metrics_lib.Averager()  # on device; one host sync per update
    num_steps = 0
    rows = batch["prompts"].shape[0]
    for epoch in range(rl.ppo_epochs):
      perm = np.asarray(jax.random.permutation(
          jax.random.fold_in(rng, epoch), rows))
      for start in range(0, rows, rl.mini_batch_size):
        idx = perm[start:start + rl.mini_batch_size]
        state, m = self.step_fn(state, {k: batch[k][idx] for k in TRAIN_KEYS})
        avg.update(m)
        num_steps += 1
        if num_steps == 1:
          faults.maybe_crash("train_step", update_index)
    metrics = avg.compute()
    metrics["skipped"] = round(metrics["skipped"] * num_steps)  # a count
    return state, metrics

  def update(self, state: ts.TrainState, ref_params, rng: jax.Array, *,
             update_index: int) -> tuple[ts.TrainState, dict[str, float]]:
    """One RL update (every process calls it); host metrics on all.

    Raises:
      ValueError: `kl_coef` set and `ref_params` None (before the rollouts).
    """
    self._check_reference(ref_params)
    rng_collect, rng_perm = jax.random.split(rng)
    collected = self.collect(state.params, rng_collect,
                             update_index=update_index)
    metrics = dict(collected.metrics)
    t = time.time()
    batch, batch_metrics = self.build_batch(state, ref_params, collected)
    metrics.update(batch_metrics)
    metrics["time/scoring"] = time.time() - t
    logging.info("update %d: %d samples scored in %.0f s; training",
                 update_index + 1, len(collected.samples),
                 metrics["time/scoring"])
    t = time.time()
    state, step_metrics = self._learn(state, batch, rng_perm,
                                      update_index=update_index)
    metrics.update(step_metrics)
    metrics["time/train"] = time.time() - t
    episodes = collected.episodes
    metrics.update({
        "success_rate": float(np.mean([e.success for e in episodes])),
        "episode_length": float(np.mean([e.length for e in episodes])),
        "num_samples": float(len(collected.samples)),
        "env_errors": float(sum(e.error is not None for e in episodes)),
    })
    return state, metrics
