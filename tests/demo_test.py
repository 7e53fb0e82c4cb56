"""Demo warm start: demonstration records, tokenizer, a miniature end to end."""

import hashlib
import json
import re

import jax
import numpy as np
import pytest
import transformers

from seed_jax import annotators
from seed_jax import demo
from seed_jax import demonstrations
from seed_jax import model as model_lib
from seed_jax import rollout as rollout_lib
from seed_jax import sampler as sampler_lib
from seed_jax import skills
from seed_jax import stage1
from seed_jax.envs import household_world as hw
from seed_jax.episodes import Step

_REPLY = re.compile(r"^<think>[^<>]+</think><action>([^<>]+)</action>$")


@pytest.fixture(scope="module")
def records():
  return demonstrations.demonstrations(num_tasks=6, seed=0, max_steps=12,
                             skill_fraction=0.5, analysis_fraction=0.5)


def test_records_have_the_stage1_fields(records):
  kinds = [r["kind"] for r in records]
  assert set(kinds) == set(demonstrations.KINDS)
  # act, skill, analysis
  assert kinds == sorted(kinds, key=demonstrations.KINDS.index)
  assert kinds.count("analysis") == 3
  for r in records:
    assert set(stage1.FIELDS) <= set(r)
    assert isinstance(r["success"], bool)
    assert r["family"] in hw.FAMILIES and r["task"] in r["prompt"]


def test_acting_replies_are_short_and_admissible(records):
  for r in records:
    if r["kind"] == "analysis":
      continue
    m = _REPLY.match(r["response"])
    assert m, r["response"]
    assert f"'{m.group(1)}'" in r["prompt"].rsplit("admissible actions", 1)[1]
    assert r["response"].startswith(f"<think>Task: {r['task']}. ")
    assert len(r["response"]) < 200


def test_skill_prompts_carry_the_block_and_name_the_place(records):
  by_task = {}
  for r in records:
    has_block = "**Episode-Level Skill**" in r["prompt"]
    assert has_block == (r["kind"] == "skill")
    if r["kind"] == "skill":
      by_task.setdefault(r["task"], []).append(r)
  assert len(by_task) == 3
  for rs in by_task.values():
    skill = rs[0]["prompt"].split("current episode:\n[", 1)[1].split("]\n")[0]
    assert all(skill in r["prompt"] for r in rs)
    takes = [_REPLY.match(r["response"]).group(1) for r in rs]
    first = next(a for a in takes if a.startswith("take "))
    place = first.split(" from ", 1)[1]
    assert re.search(rf"\b{place}\b", skill), (skill, first)


def test_analysis_responses_parse(records):
  analyses = [r for r in records if r["kind"] == "analysis"]
  for r in analyses:
    assert r["prompt"].startswith("Analyze the following agent episode")
    parsed = skills.parse_analysis(r["response"])
    assert isinstance(parsed, skills.Analysis)
    assert parsed.skill == json.loads(r["response"])["episode_skill"]
    assert len(parsed.skill) <= annotators.MAX_SKILL_CHARS


def test_demonstrations_are_deterministic(records):
  again = demonstrations.demonstrations(num_tasks=6, seed=0, max_steps=12,
                              skill_fraction=0.5, analysis_fraction=0.5)
  assert again == records
  other = demonstrations.demonstrations(num_tasks=6, seed=1, max_steps=12,
                              skill_fraction=0.5, analysis_fraction=0.5)
  assert other != records


def test_reason_follows_the_subgoal():
  world = hw.generate(2)  # a heat task
  assert world.family == "heat"
  assert demonstrations.reason(world) == f"Find a {world.obj_type}."
  obj = world.instances(world.obj_type)[0]
  world.contents[world.where(obj)].remove(obj)
  world.holding = obj
  assert demonstrations.reason(world) == f"Heat the {obj} with the microwave 1."
  world.states["hot"].add(obj)
  assert demonstrations.reason(world).startswith(f"Put the {obj} ")


def test_search_hint_names_the_place_tried():
  reply = demonstrations.reply
  world = hw.generate(2)
  plain = reply(world, "go to cabinet 3")
  hinted = reply(world, "go to cabinet 3", hint=True)
  assert hinted == plain.replace(".</think>", ". Try cabinet 3.</think>")
  # Only search moves carry it: not other actions, nor a move while holding.
  assert reply(world, "open cabinet 3", hint=True) == reply(
      world, "open cabinet 3")
  obj = world.instances(world.obj_type)[0]
  world.contents[world.where(obj)].remove(obj)
  world.holding = obj
  assert reply(world, "go to microwave 1", hint=True) == reply(
      world, "go to microwave 1")
  recs = demonstrations.demonstrations(num_tasks=4, seed=0, max_steps=12,
                             skill_fraction=0.5, analysis_fraction=0.0,
                             search_hint=True)
  tried = [r for r in recs if " Try " in r["response"]]
  assert tried
  for r in tried:
    action = _REPLY.match(r["response"]).group(1)
    assert r["response"].endswith(
        f"Try {action[len('go to '):]}.</think><action>{action}</action>")


def test_first_search_follows_counts_moves_to_the_named_place():
  seeds = [0, 1, 2, 3]
  peeking = demonstrations._play(
      seeds, lambda i, env: demonstrations.envs.make_expert(
          env, peek=True, noise=0.0), max_steps=12, history_length=2)
  named = [annotators.annotate(ep)["episode_skill"] for ep in peeking]
  # A peeking expert heads straight for the object; the annotator's skill of
  # a success names where it was.
  assert demo._first_search_follows(peeking, named) == (1.0, len(seeds))
  elsewhere = [re.sub(r"\b[a-z]+ \d+\b", "nowhere 9", k) for k in named]
  assert demo._first_search_follows(peeking, elsewhere) == (0.0, 0)


def test_relabeled_search_steps_go_where_the_skill_says():
  kw = dict(num_tasks=6, seed=0, max_steps=12, skill_fraction=0.0,
            analysis_fraction=0.0, shuffle_search=True, search_hint=True)
  base = demonstrations.demonstrations(**kw)
  recs = demonstrations.demonstrations(**kw, skill_relabel=True)
  assert recs[:len(base)] == base
  added = recs[len(base):]
  assert added and {r["kind"] for r in added} == {"skill"}
  for r in added:
    skill = r["prompt"].split("current episode:\n[", 1)[1].split("]\n")[0]
    action = _REPLY.match(r["response"]).group(1)
    place = action[len("go to "):]
    assert action.startswith("go to ") and re.search(rf"\b{place}\b", skill)
    assert f"'{action}'" in r["prompt"].rsplit("admissible actions", 1)[1]
    assert r["response"].endswith(f"Try {place}.</think><action>{action}"
                                  "</action>")


def _kinds_advised(skill):
  """Kinds of place a kind-detail skill sends a search to."""
  found = re.findall(r"\bcheck ([a-z]+)s first|\bunexplored ([a-z]+)s\b"
                     r"|\bin a ([a-z]+)\b", skill)
  return {k for groups in found for k in groups if k}


def test_kind_detail_skills_send_searches_to_a_kind_of_place():
  kw = dict(num_tasks=12, seed=0, max_steps=20, skill_fraction=1.0,
            analysis_fraction=0.5, shuffle_search=True, search_hint=True,
            skill_relabel=True)
  recs = demonstrations.demonstrations(**kw, rule_detail="kind")
  skill_searches = 0
  for r in recs:
    if r["kind"] == "analysis":
      continue
    action = _REPLY.match(r["response"]).group(1)
    why = r["response"].split("</think>", 1)[0]
    if (r["kind"] != "skill" or not action.startswith("go to ")
        or not re.search(r"\. Find a [a-z]+\.", why)):
      continue
    skill = r["prompt"].split("current episode:\n[", 1)[1].split("]\n")[0]
    place = action[len("go to "):]
    assert hw.kind(place) in _kinds_advised(skill), (skill, action)
    # Named only as the appliance ("go to sinkbasin 1 and clean it").
    told = re.sub(r"go to [a-z]+ 1 and [a-z]+ it", "", skill)
    assert not re.search(rf"\b{place}\b", told), (skill, action)
    assert f"'{action}'" in r["prompt"].rsplit("admissible actions", 1)[1]
    skill_searches += 1
  assert skill_searches > 20
  # Relabeling by kind: a move elsewhere becomes one to the next place of
  # the advised kind the episode searched, so there are more such moves.
  without = demonstrations.demonstrations(**dict(kw, skill_relabel=False),
                                          rule_detail="kind")
  assert len(recs) > len(without)
  with pytest.raises(ValueError, match="rule detail must be one of"):
    demonstrations.demonstrations(**kw, rule_detail="room")


def test_a_move_to_the_lamp_is_explained_by_its_kind():
  def step(action, why):
    return Step(observation="o", prompt="p", response=(
        demonstrations._reply_text("look at mug under the desklamp", why,
                                   action, hint=True)),
                action=action, action_valid=True)
  to_lamp = step("go to desk 2", "Look at the mug 1 under the desklamp.")
  explained = demonstrations._explained
  won = ("To look at an object under the lamp: find the mug (check drawers "
         "first), take it, go to a desk where desklamp 1 stands and use the "
         "desklamp while holding it.")
  lost = "The desklamp 1 is on a desk; carry the mug there and use it."
  assert explained(to_lamp, won, "kind") and explained(to_lamp, lost, "kind")
  for other in (won.replace("a desk where", "a dresser where"),
                lost.replace("on a desk", "on a sidetable"),
                "Check desks first for the mug."):  # the object's place
    assert not explained(to_lamp, other, "kind"), other
  assert explained(to_lamp, won.replace("a desk", "desk 2"), "place")
  assert not explained(to_lamp, won.replace("a desk", "desk 1"), "place")
  # A move to find the object itself still needs its kind as search advice.
  find = step("go to drawer 3", "Find a mug.")
  assert explained(find, won, "kind")
  assert not explained(find, won.replace("drawers", "shelfs"), "kind")
  assert explained(step("go to desk 2", "Put the mug 1 in the desk."), "",
                   "kind")  # not a search: always kept


def test_first_search_follows_by_kind():
  seeds = [0, 1, 2, 3]
  peeking = demonstrations._play(
      seeds, lambda i, env: demonstrations.envs.make_expert(
          env, peek=True, noise=0.0), max_steps=12, history_length=2)
  kinds = [annotators.annotate(ep, "kind")["episode_skill"] for ep in peeking]
  assert demo._first_search_follows(peeking, kinds, "kind") == (1.0, 4)
  # A place-detail reading finds a place named in a kind-detail skill only
  # where the object lay in the appliance the skill sends it to.
  in_appliance = sum(ep.ground_truth.get("appliance") in
                     ep.ground_truth["start_locations"].values()
                     for ep in peeking)
  assert in_appliance < len(seeds)
  assert demo._first_search_follows(peeking, kinds)[1] == in_appliance
  other = [re.sub(r"\b([a-z]+)s first", "armchairs first", k) for k in kinds]
  assert demo._first_search_follows(peeking, other, "kind")[0] < 1.0


def test_skill_following_searches_go_only_where_the_skill_says():
  # The peeking expert knows where a second object or the lamp is; a search
  # move the skill in the prompt does not explain is left out.
  recs = demonstrations.demonstrations(num_tasks=24, seed=0, max_steps=20,
                                       skill_fraction=1.0,
                                       analysis_fraction=0.0)
  searches = 0
  for r in recs:
    action = _REPLY.match(r["response"]).group(1)
    why = r["response"].split("</think>", 1)[0]
    if (r["kind"] != "skill" or not action.startswith("go to ")
        or not re.search(r"\. (Find a |Look at the )", why)):
      continue
    searches += 1
    skill = r["prompt"].split("current episode:\n[", 1)[1].split("]\n")[0]
    assert re.search(rf"\b{action[len('go to '):]}\b", skill), (skill, action)
  seconds = [r for r in recs if r["kind"] == "skill"
             and r["family"] == "pick_two" and "Find a second" in r["response"]]
  assert searches > 10 and seconds


@pytest.mark.parametrize("phrases", [True, False])
def test_tokenizer_round_trips(records, phrases, tmp_path):
  tok = demo.demo_tokenizer(records, 512, phrases=phrases)
  assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
  texts = [t for r in records[:20] + records[-2:]
           for t in (r["prompt"], r["response"])]
  for text in texts:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == text
  # policies.prepare saves the tokenizer in the policy folder and reloads it.
  tok.save_pretrained(str(tmp_path))
  again = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert all(again.encode(t, add_special_tokens=False)
             == tok.encode(t, add_special_tokens=False) for t in texts)
  assert again.chat_template == tok.chat_template


def test_names_and_tags_are_tokens_of_their_own(records):
  tok = demo.demo_tokenizer(records, 1024)
  for tag in demo.TAGS:
    assert len(tok.encode(tag, add_special_tokens=False)) == 1
  r = next(r for r in records if r["kind"] == "skill")
  action = _REPLY.match(r["response"]).group(1)
  place = " " + " ".join(action.split()[-2:])  # e.g. " cabinet 2"
  ids = tok.encode(place, add_special_tokens=False)
  assert tok.convert_ids_to_tokens(ids) == [
      "\u0120" + w for w in place.split()]  # byte-level "\u0120" is a space
  for text in (r["prompt"], r["response"]):  # the same tokens in both
    got = tok.encode(text, add_special_tokens=False)
    assert any(got[i:i + len(ids)] == ids for i in range(len(got)))


def test_transcripts_pack_whole_turns(records):
  tok = demo.demo_tokenizer(records, 512)
  packed = demo.transcripts(records, tok, max_tokens=1024)
  acting = [r for r in records if r["kind"] != "analysis"]
  assert 0 < len(packed) < len(acting)
  joined = tok.eos_token.join(r["response"] for r in packed)
  assert joined == tok.eos_token.join(
      "<|user|>" + r["prompt"] + "<|assistant|>" + r["response"]
      for r in acting)
  for r in packed:
    assert r["prompt"] == "" and r["kind"] == "text"
    assert len(tok.encode(r["response"], add_special_tokens=False)) < 1024
  # Each turn is tokenized as a rollout sees it: the prompt's chat turn,
  # then the reply.
  first = acting[0]
  turn = tok.apply_chat_template([{"role": "user", "content": first["prompt"]}],
                                 tokenize=False, add_generation_prompt=True)
  want = (tok.encode(turn, add_special_tokens=False)
          + tok.encode(first["response"], add_special_tokens=False))
  got = tok.encode(packed[0]["response"], add_special_tokens=False)
  assert got[:len(want)] == want


def test_evaluate_skills_cuts_analysis_prompts_as_rl_does(records,
                                                          monkeypatch):
  tok = demo.demo_tokenizer(records, 512)
  config = demo.demo_model_config(
      len(tok), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
      intermediate_size=64, max_position_embeddings=1024)
  params = demo.init_params(config, jax.random.key(0))
  policy = rollout_lib.Policy(config, tok, max_new_tokens=8,
                              buckets=(384, 640), truncate_prompts=True,
                              min_rows=2)
  analyzed, generate = [], rollout_lib.Policy.generate

  def spy(self, params, prompts, rng, sampling, **kwargs):
    if isinstance(sampling, sampler_lib.Greedy):
      analyzed.extend(prompts)
    return generate(self, params, prompts, rng, sampling, **kwargs)

  monkeypatch.setattr(rollout_lib.Policy, "generate", spy)
  out = demo.evaluate_skills(policy, params, split="eval_seen", num_tasks=2,
                             max_steps=6, history_length=2,
                             rng=jax.random.key(1), analysis_max_new_tokens=8)
  # An untrained model's long replies make long analysis prompts: their
  # steps are cut in the middle to the largest bucket, the instructions kept.
  assert len(analyzed) == 2 and out["analysis_prompts_cut"] == 2
  assert out["analysis_prompts_unfit"] == 0
  for prompt in analyzed:
    assert len(policy.encode(prompt)) <= 640
    assert prompt.startswith("Analyze the following agent episode")


def test_init_params_scales_the_embedding():
  config = demo.demo_model_config(64, hidden_size=32, num_layers=1,
                                  num_heads=2, num_kv_heads=1,
                                  intermediate_size=64)
  base = model_lib.init_params(config, jax.random.key(0))
  scaled = demo.init_params(config, jax.random.key(0), embed_std=0.02)
  np.testing.assert_allclose(scaled["embed"]["embedding"],
                             0.02 * base["embed"]["embedding"], rtol=1e-6)


def test_miniature_warm_start_end_to_end():
  config, params, tok, report = demo.warm_start(
      num_tasks=3, seed=0, max_steps=2, vocab_size=512, batch_size=4,
      analysis_fraction=0.5,
      lm_tokens=512, eval_tasks=1, skill_eval_tasks=1,
      model=dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                 intermediate_size=64, max_position_embeddings=768),
      buckets=(512,), analysis_max_chars=1200)
  assert config.vocab_size == len(tok) and config.num_kv_heads == 1
  assert params["embed"]["embedding"].shape == (len(tok), 32)
  assert report["records/act"] > 0 and report["records/analysis"] == 2
  # Slips are sent as the no-op here: no prompt shows a failed try.
  assert {k: v for k, v in report.items()
          if k.startswith("records/after_failed/")} == {
              "records/after_failed/rule/again": 0,
              "records/after_failed/rule/other": 0,
              "records/after_failed/plain/again": 0,
              "records/after_failed/plain/other": 0}
  assert report["lm/steps"] >= 1 and report["sft/steps"] >= 1
  for key in ("seen/success", "unseen/success", "skills/plain_success",
              "skills/skill_success", "skills/parse_rate",
              "skills/plain_valid", "skills/plain_first_search_follows",
              "skills/skill_first_search_follows", "skills/plain_repeated",
              "skills/skill_repeated"):
    assert 0.0 <= report[key] <= 1.0, key
  assert report["seconds/total"] > 0


_MINI = dict(num_tasks=3, max_steps=2, vocab_size=512, batch_size=4,
             analysis_fraction=0.5, lm_tokens=512, eval_tasks=0,
             skill_eval_tasks=0, buckets=(512,), analysis_max_chars=1200,
             model=dict(hidden_size=32, num_layers=1, num_heads=2,
                        num_kv_heads=1, intermediate_size=64,
                        max_position_embeddings=768))


def test_prepare_shares_a_cached_warm_start(tmp_path, monkeypatch):
  from seed_jax import policies  # pylint: disable=g-import-not-at-top
  cache = tmp_path / "cache"
  first = policies.prepare(tmp_path / "a", seed=3, source="demo", stage1=None,
                           demo_kwargs=_MINI, cache_dir=str(cache))
  [folder] = list(cache.iterdir())
  # The key of a household warm start leaves `env` out, as before Sokoban
  # had one, so that earlier caches stay valid.
  key = json.dumps(dict(_MINI, seed=3, version=demo.VERSION), sort_keys=True)
  assert folder.name == (
      f"demo_seed3_{hashlib.sha256(key.encode()).hexdigest()[:12]}")
  assert (tmp_path / "a" / "policy" / "report.json").exists()

  def no_training(**kwargs):
    raise AssertionError("the cached warm start should have been reused")

  monkeypatch.setattr(demo, "warm_start", no_training)
  again = policies.prepare(tmp_path / "b", seed=3, source="demo", stage1=None,
                           demo_kwargs=_MINI, cache_dir=str(cache))
  assert again.config == first.config
  np.testing.assert_array_equal(again.params["embed"]["embedding"],
                                first.params["embed"]["embedding"])
  assert again.report["warm_start"]["records/analysis"] == 2
  # Newer warm-start code is another warm start.
  monkeypatch.setattr(demo, "VERSION", demo.VERSION + 1)
  with pytest.raises(AssertionError, match="reused"):
    policies.prepare(tmp_path / "d", seed=3, source="demo", stage1=None,
                     demo_kwargs=_MINI, cache_dir=str(cache))
  monkeypatch.setattr(demo, "VERSION", demo.VERSION - 1)
  # Another seed is another warm start.
  with pytest.raises(AssertionError, match="reused"):
    policies.prepare(tmp_path / "c", seed=4, source="demo", stage1=None,
                     demo_kwargs=_MINI, cache_dir=str(cache))
